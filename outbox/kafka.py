"""The Kafka side of the relay: the producer's configuration, an outbox row as a Kafka record,
and which delivery errors mean "the broker is unavailable" (wait and retry, no attempt counted)
rather than "this message cannot be delivered" (count an attempt, park it eventually)."""

import json
import logging
from typing import Any

from confluent_kafka import KafkaError, Producer

from outbox.config import RelaySettings
from outbox.store import ClaimedMessage

logger = logging.getLogger("outbox.kafka")

# The broker (or the way to it) is unavailable: nothing is wrong with the message itself.
UNAVAILABLE_CODES = frozenset({
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError._TIMED_OUT_QUEUE,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError._QUEUE_FULL,
    KafkaError._PURGE_QUEUE,
    KafkaError._PURGE_INFLIGHT,
    KafkaError._DESTROY,
    KafkaError._FATAL,
    KafkaError._NODE_UPDATE,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.KAFKA_STORAGE_ERROR,
})

# The message can never go out as it is: too large, no such topic, not authorised, invalid.
UNDELIVERABLE_CODES = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG,
    KafkaError._INVALID_ARG,
})


def broker_unavailable(error: KafkaError) -> bool:
    """True when `error` says nothing about the message, only that Kafka could not be reached."""
    code = error.code()
    if code in UNDELIVERABLE_CODES:
        return False
    return code in UNAVAILABLE_CODES or bool(error.retriable())


def describe(error: KafkaError) -> str:
    """`MSG_SIZE_TOO_LARGE: Broker: Message size too large`, for last_error and logs."""
    return f"{error.name()}: {error.str()}"


def producer_config(settings: RelaySettings, client_id: str) -> dict[str, Any]:
    """An idempotent producer (acks=all) whose deliveries end within the delivery timeout."""
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": int(settings.linger.total_seconds() * 1000),
        "message.timeout.ms": int(settings.delivery_timeout.total_seconds() * 1000),
        "queue.buffering.max.messages": max(100_000, 2 * settings.batch_size),
        # Notice a broker that is back within a couple of seconds (librdkafka's default is 10 s).
        "reconnect.backoff.max.ms": 2_000,
        "logger": logger,
    }


def new_producer(settings: RelaySettings, client_id: str, on_error: Any = None) -> Producer:
    config = producer_config(settings, client_id)
    if on_error is not None:
        config["error_cb"] = on_error
    return Producer(config)


def record_headers(message: ClaimedMessage) -> list[tuple[str, bytes]]:
    """The row's `headers` (message id, event type, contract version, correlation id,
    traceparent when present) plus the aggregate's type and id, as UTF-8 header values."""
    headers = dict(message.headers)
    headers.setdefault("aggregate_type", message.aggregate_type)
    headers.setdefault("aggregate_id", message.aggregate_id)
    headers.setdefault("message_id", str(message.id))
    return [
        (name, (value if isinstance(value, str) else json.dumps(value)).encode())
        for name, value in headers.items()
        if value is not None
    ]


def record_timestamp_ms(message: ClaimedMessage) -> int:
    """The Kafka timestamp: the row's created_at, in milliseconds since the epoch."""
    return int(message.created_at.timestamp() * 1000)
