"""How the relay tells Kafka's errors apart, without a broker: the broker unavailable (retry,
the row stays) or the message undeliverable (detour), a refusal (bad credentials or
certificates), the client's repeated lines once a minute, and the backoff between retries."""

import random
from datetime import timedelta

import pytest
from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st

from core.supervise import backoff_delay
from outbox import kafka
from outbox.config import load_relay_settings
from outbox.kafka import broker_unavailable


@pytest.mark.parametrize(
    ("code", "unavailable"),
    [
        (KafkaError._MSG_TIMED_OUT, True),
        (KafkaError._TRANSPORT, True),
        (KafkaError._ALL_BROKERS_DOWN, True),
        (KafkaError.NOT_ENOUGH_REPLICAS, True),
        (KafkaError._PURGE_INFLIGHT, True),
        (KafkaError.UNKNOWN_PRODUCER_ID, True),  # a restarted broker forgot the producer
        (KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, True),
        (KafkaError.MSG_SIZE_TOO_LARGE, False),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, False),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, False),
        (KafkaError._UNKNOWN_TOPIC, False),
        (KafkaError.INVALID_RECORD, False),
    ],
)
def test_errors_are_told_apart_broker_unavailable_or_message_undeliverable(
    code: int, unavailable: bool
) -> None:
    assert broker_unavailable(KafkaError(code)) is unavailable


def test_a_fatal_producer_error_is_never_the_message_s_fault() -> None:
    assert broker_unavailable(KafkaError(KafkaError.INVALID_RECORD, fatal=True))


@given(failures=st.integers(min_value=1, max_value=60), seed=st.integers())
def test_backoff_doubles_from_the_initial_delay_up_to_the_cap_with_jitter(
    failures: int, seed: int
) -> None:
    initial, cap = timedelta(seconds=1), timedelta(minutes=1)
    ceiling = min(60.0, 2.0 ** (failures - 1))

    delay = backoff_delay(failures, initial, cap, random.Random(seed))

    assert ceiling / 2 <= delay <= ceiling

def test_refusals_are_told_apart_from_an_unavailable_broker() -> None:
    assert kafka.refused(KafkaError(KafkaError._AUTHENTICATION))
    assert kafka.refused(KafkaError(KafkaError._SSL))
    assert kafka.refused(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED))
    assert not kafka.refused(KafkaError(KafkaError._TRANSPORT, "Connect failed: refused"))
    assert kafka.refused(KafkaError(KafkaError._TRANSPORT, (
        "ssl://b:9093/bootstrap: Receive failed: error:0A00045C:SSL routines::tlsv13 alert "
        "certificate required: SSL alert number 116")))
    assert not kafka.refused(KafkaError(KafkaError._ALL_BROKERS_DOWN))
    # This side's verification of the broker, reported as a transport error ahead of _SSL.
    assert kafka.refused(KafkaError(KafkaError._TRANSPORT, (
        "ssl://127.0.0.1:24528/bootstrap: error:0A000086:SSL routines::certificate verify"
        " failed")))


def test_a_principal_that_may_not_produce_is_a_refusal_naming_its_acls() -> None:
    # The idempotent producer's id refused (no Write on any topic): fatal, and no new producer
    # would fare better. A topic on OUTBOX_TOPICS it may not write is a refusal too.
    cluster = KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "Failed to acquire "
                         "idempotence PID from broker b/1: Broker: Cluster authorization failed",
                         fatal=True)
    assert kafka.refused(cluster)
    assert kafka.refused(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))  # a topic it may not write
    assert kafka.not_authorized(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    settings = load_relay_settings({
        "KAFKA_BOOTSTRAP_SERVERS": "b:9096", "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "KAFKA_SASL_USERNAME": "pin_outbox_relay",
        "KAFKA_SASL_PASSWORD": "s3cret"})

    line = str(kafka.refusal(cluster, settings))

    assert line == (
        "kafka refused the relay (SASL_SSL SCRAM-SHA-512): CLUSTER_AUTHORIZATION_FAILED: Failed "
        "to acquire idempotence PID from broker b/1: Broker: Cluster authorization failed; check "
        "the ACLs of User:pin_outbox_relay: Write and DescribeConfigs on the topic "
        '(docs/operations.md, "Kafka ACLs")')
    assert kafka.principal(load_relay_settings({"KAFKA_BOOTSTRAP_SERVERS": "b:9092"})) == (
        "User:ANONYMOUS")


def test_repeated_client_errors_are_logged_once_a_minute() -> None:
    repeats = kafka.RepeatFilter(window_s=60)
    line = "_TRANSPORT: 127.0.0.1:9/bootstrap: Connect failed (after {}ms in state CONNECT)"
    assert [repeats.fresh(line.format(n)) for n in (1, 2, 3)] == [True, False, False]
    assert repeats.fresh("_ALL_BROKERS_DOWN: 1/1 brokers are down")

