"""Reading a topic back from its start: the demo prints what the relay published, and the
tests check it. A fresh consumer group each time, so nothing is skipped or committed."""

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from reminders import events


@dataclass(frozen=True)
class Record:
    key: str
    value: bytes
    headers: dict[str, str]
    timestamp_ms: int
    partition: int
    offset: int

    @property
    def message_id(self) -> str:
        return self.headers["message_id"]

    def json(self) -> Any:
        return json.loads(self.value)


def read_topic(bootstrap: str, topic: str = events.TOPIC, *, timeout: float = 30.0,
               security: Mapping[str, Any] | None = None) -> list[Record]:
    """Every record now in `topic` (all partitions, from the start, each up to the end it has
    when the reader gets there), in partition then offset order; `security` adds librdkafka's
    TLS and SASL properties (outbox.kafka.security_config)."""
    consumer = Consumer({
        **(security or {}),
        "bootstrap.servers": bootstrap,
        "group.id": f"read-topic-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # The end is where a fetch says it is: Tansu 0.6 answers ListOffsets (the watermark
        # query) with its last batch's first offset, short of the real end.
        "enable.partition.eof": True,
    })
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = sorted(metadata.topics[topic].partitions) if topic in metadata.topics else []
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        return _read_to_end(consumer, topic, set(partitions), timeout)
    finally:
        consumer.close()


def _read_to_end(consumer: Consumer, topic: str, pending: set[int], timeout: float
                 ) -> list[Record]:
    """The records of the assigned partitions, read until each says it is at its end."""
    records: list[Record] = []
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"could not read {topic} to its end in {timeout}s")
        message = consumer.poll(0.2)
        if message is None:
            continue
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF:
                pending.discard(message.partition())
            continue
        records.append(Record(
            key=(message.key() or b"").decode(), value=message.value() or b"",
            headers={k: (v or b"").decode() for k, v in (message.headers() or [])},
            timestamp_ms=message.timestamp()[1], partition=message.partition(),
            offset=message.offset(),
        ))
    return sorted(records, key=lambda r: (r.partition, r.offset))
