"""librdkafka mock-cluster controls the tests need beyond devtools.mock_kafka's: a partition's
leader, errors for the next requests of an API, and a broker's round-trip time (on the library
and cluster it drives)."""

import ctypes

from devtools.mock_kafka import MockKafkaCluster, MockKafkaError

PRODUCE_API = 0  # the Kafka protocol's ApiKey of a Produce request


def set_partition_leader(cluster: MockKafkaCluster, topic: str, partition: int,
                         broker: int) -> None:
    lib = cluster._lib  # the same library and cluster: more of its mock API
    lib.rd_kafka_mock_partition_set_leader.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                                       ctypes.c_int32, ctypes.c_int32]
    err = lib.rd_kafka_mock_partition_set_leader(cluster._cluster,
                                                 topic.encode(), partition, broker)
    if err != 0:
        raise MockKafkaError(f"set_partition_leader failed with librdkafka error {err}")


def push_request_errors(cluster: MockKafkaCluster, api_key: int, *errors: int) -> None:
    """The next len(errors) requests of `api_key`, to any broker, fail with these errors."""
    lib = cluster._lib
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [
        ctypes.c_void_p, ctypes.c_int16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]
    codes = (ctypes.c_int * len(errors))(*errors)
    lib.rd_kafka_mock_push_request_errors_array(cluster._cluster, api_key,
                                                len(errors), codes)


def set_broker_rtt(cluster: MockKafkaCluster, broker: int, rtt_ms: int) -> None:
    """Every answer of `broker` comes `rtt_ms` late (0: at once); it still takes each request
    when it arrives (a leader that appends, then answers late)."""
    lib = cluster._lib
    lib.rd_kafka_mock_broker_set_rtt.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int]
    err = lib.rd_kafka_mock_broker_set_rtt(cluster._cluster, broker, rtt_ms)
    if err != 0:
        raise MockKafkaError(f"set_broker_rtt failed with librdkafka error {err}")
