"""librdkafka's built-in mock Kafka cluster, for the demo, the tests and the benchmark (never
production): no broker can be installed here.

confluent-kafka creates a mock cluster from `test.mock.num.brokers` but exposes none of its
controls, so this module drives librdkafka's mock API directly through ctypes, on the very
library confluent-kafka ships; that adds what the tests need: taking brokers down and up.
"""

import ctypes
from pathlib import Path
from types import TracebackType

import confluent_kafka

_RD_KAFKA_PRODUCER = 0
_ERRSTR_SIZE = 512


class MockKafkaError(RuntimeError):
    """librdkafka refused a mock-cluster call."""


def _library_path() -> Path:
    package = Path(confluent_kafka.__file__).resolve().parent
    candidates = sorted((package.parent / "confluent_kafka.libs").glob("librdkafka*.so*"))
    if not candidates:
        raise MockKafkaError(f"librdkafka not found next to {package}")
    return candidates[0]


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(_library_path()))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_broker_set_down.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_broker_set_up.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                               ctypes.c_int]
    return lib


class MockKafkaCluster:
    """A mock cluster of `brokers` brokers (ids 1..n) on loopback ports, alive until `close()`."""

    def __init__(self, brokers: int = 3) -> None:
        self._lib = _load()
        self.broker_ids = tuple(range(1, brokers + 1))
        errstr = ctypes.create_string_buffer(_ERRSTR_SIZE)
        conf = self._lib.rd_kafka_conf_new()
        # The handle that owns the cluster logs nothing; the clients log their own view.
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"0", errstr, _ERRSTR_SIZE)
        self._handle = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, _ERRSTR_SIZE)
        if not self._handle:
            raise MockKafkaError(errstr.value.decode())
        self._cluster = self._lib.rd_kafka_mock_cluster_new(self._handle, brokers)
        if not self._cluster:
            self._lib.rd_kafka_destroy(self._handle)
            raise MockKafkaError("rd_kafka_mock_cluster_new failed")
        self.bootstrap_servers: str = self._lib.rd_kafka_mock_cluster_bootstraps(
            self._cluster).decode()

    def _check(self, err: int, what: str) -> None:
        if err != 0:
            raise MockKafkaError(f"{what} failed with librdkafka error {err}")

    def create_topic(self, topic: str, partitions: int, replication_factor: int = 1) -> None:
        self._check(self._lib.rd_kafka_mock_topic_create(
            self._cluster, topic.encode(), partitions, replication_factor), "create_topic")

    def set_down(self, *broker_ids: int) -> None:
        """Disconnect brokers and refuse new connections (default: all of them)."""
        for broker in broker_ids or self.broker_ids:
            self._check(self._lib.rd_kafka_mock_broker_set_down(self._cluster, broker), "set_down")

    def set_up(self, *broker_ids: int) -> None:
        """Accept connections again (default: all brokers)."""
        for broker in broker_ids or self.broker_ids:
            self._check(self._lib.rd_kafka_mock_broker_set_up(self._cluster, broker), "set_up")

    def close(self) -> None:
        if self._cluster:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._cluster = None
        if self._handle:
            self._lib.rd_kafka_destroy(self._handle)
            self._handle = None

    def __enter__(self) -> "MockKafkaCluster":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
