"""The outbox against Kafka (`--against-topic`): the window's records read from every
partition of the topic, from `offsets_for_times` at the window's start to the end, with the
relay's Kafka settings (TLS and SASL included), and reconciled with the table.

The reader is assigned its partitions: it joins no consumer group (confluent-kafka wants a
group.id all the same; a fresh one, never used) and commits nothing. Its ACLs: Read on the
topic, Describe on the groups prefixed GROUP_PREFIX (docs/operations.md, "Kafka ACLs").
"""

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import ClusterMetadata

from outbox.config import RelaySettings
from outbox.kafka import LibrdkafkaLog, client_config, not_authorized, principal, redact, refused, secrets

# The reader's throwaway group ids start with this: librdkafka looks up the coordinator of its
# group (FindCoordinator, Describe on the group), though it joins none and commits nothing.
GROUP_PREFIX = "audit-reminders-"


class TopicEvent(NamedTuple):
    """An outbox row of the window, as the topic should have it (in stream order)."""

    id: str
    key: str
    topic: str
    published: bool


class TopicRecord(NamedTuple):
    message_id: str
    key: str
    partition: int
    offset: int
    timestamp_ms: int


class BrokerUnavailableError(RuntimeError):
    """Kafka could not be reached (or read to the end) in time."""


class BrokerRefusedError(RuntimeError):
    """The broker refused the audit's credentials or TLS handshake (the relay's settings)."""


@dataclass
class TopicReader:
    """Reads the records of a window from the topics, partition by partition."""

    settings: RelaySettings
    timeout_s: float = 60.0
    partitions_read: int = 0
    _errors: list[KafkaError] = field(default_factory=list)

    def _consumer(self) -> Consumer:
        return Consumer({
            **client_config(self.settings),
            "group.id": f"{GROUP_PREFIX}{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            # The end is where a fetch says it is (Tansu 0.6 answers the watermark query short).
            "enable.partition.eof": True,
            # A read to the end, not a live tail: bigger fetches, a smaller prefetch queue
            # (its default, 64 MB, would be most of the audit's memory).
            "max.partition.fetch.bytes": 4 * 1024 * 1024,
            "queued.max.messages.kbytes": 16 * 1024,
            "fetch.wait.max.ms": 100,
            "error_cb": self._errors.append,
            # librdkafka's lines through the log, without the failures this reader reports
            "logger": LibrdkafkaLog(secrets(self.settings)),
        })

    def _fail(self, exc: BaseException | None = None) -> Exception:
        raised = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        for error in [*self._errors, *([raised] if isinstance(raised, KafkaError) else [])]:
            if not_authorized(error):
                return BrokerRefusedError(redact(
                    f"kafka refused the audit ({self.settings.security.protocol}): "
                    f"{error.str()}; check the ACLs of {principal(self.settings)}: Read on the "
                    f"topic, Describe on the groups prefixed {GROUP_PREFIX} (docs/operations.md, "
                    '"Kafka ACLs")', self.settings))
            if refused(error):
                return BrokerRefusedError(redact(
                    f"kafka refused the audit ({self.settings.security.protocol}): {error.str()}; "
                    "check KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_* and KAFKA_SSL_*", self.settings))
        detail = str(exc) if exc else (self._errors[-1].str() if self._errors else "timed out")
        return BrokerUnavailableError(redact(
            f"kafka unavailable at {self.settings.bootstrap_servers}: {detail}", self.settings))

    def read(self, topics: Iterable[str], since: datetime, until: datetime) -> list[TopicRecord]:
        """The records timestamped in [since, until], of every partition of `topics`. A topic
        the broker does not have has no record."""
        self._errors.clear()  # a reader serves every audit of --loop
        self.partitions_read = 0
        consumer = self._consumer()
        try:
            return self._read(consumer, list(topics), since, until)
        except KafkaException as exc:
            raise self._fail(exc) from None
        finally:
            consumer.close()

    def _read(self, consumer: Consumer, topics: list[str], since: datetime,
              until: datetime) -> list[TopicRecord]:
        deadline = time.monotonic() + self.timeout_s
        metadata = self._list_topics(consumer)
        # The broker lists only the topics the ACLs let the audit describe.
        self._refuse_unlisted(consumer, [t for t in topics if t not in metadata.topics], deadline)
        window = (int(since.timestamp() * 1000), int(until.timestamp() * 1000))
        wanted = _partitions(metadata, topics, window[0])
        if not wanted:
            return []
        starts = consumer.offsets_for_times(wanted, timeout=max(1.0, deadline - time.monotonic()))
        # -1: no record at or after the window's start in that partition
        assigned = [tp for tp in starts if tp.offset >= 0]
        self.partitions_read = len(wanted)
        if not assigned:
            return []
        consumer.assign(assigned)
        return self._read_to_end(consumer, assigned, window, deadline)

    def _list_topics(self, consumer: Consumer) -> ClusterMetadata:
        """The cluster's topics, asked again until the broker answers (at most 15 s, or the
        timeout if shorter); a refusal ends the wait at once."""
        connect_by = time.monotonic() + min(self.timeout_s, 15.0)
        while True:
            try:
                return consumer.list_topics(timeout=1.0)
            except KafkaException as exc:
                consumer.poll(0.1)  # serves error_cb: a refusal ends the wait at once
                if any(refused(e) for e in self._errors) or time.monotonic() > connect_by:
                    raise self._fail(exc) from None

    def _read_to_end(self, consumer: Consumer, assigned: list[TopicPartition],
                     window: tuple[int, int], deadline: float) -> list[TopicRecord]:
        """The records timestamped in `window` (ms), read until every assigned partition says
        it is at its end."""
        pending = {(tp.topic, tp.partition) for tp in assigned}
        records: list[TopicRecord] = []
        while pending:
            if time.monotonic() > deadline:
                raise self._fail(TimeoutError(f"could not read {sorted(pending)} to the end in "
                                              f"{self.timeout_s}s"))
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                if _at_end(message):
                    pending.discard((message.topic(), message.partition()))
                elif window[0] <= message.timestamp()[1] <= window[1]:
                    records.append(_record(message))
        return sorted(records, key=lambda r: (r.partition, r.offset))

    @staticmethod
    def _refuse_unlisted(consumer: Consumer, topics: list[str], deadline: float) -> None:
        """Topics the listing lacks, asked for by name: one that does not exist has no record,
        one the audit may not describe raises (not an empty topic: every event would look
        missing from it)."""
        for topic in topics:
            found = consumer.list_topics(topic, timeout=max(1.0, deadline - time.monotonic()))
            error = found.topics[topic].error if topic in found.topics else None
            if error is not None and not_authorized(error):
                raise KafkaException(error)


def _partitions(metadata: ClusterMetadata, topics: list[str], since_ms: int
                ) -> list[TopicPartition]:
    """Every partition of the listed `topics` (a topic listed with an error has none), each to
    be looked up at `since_ms`."""
    listed = [metadata.topics[t] for t in topics if t in metadata.topics]
    return [TopicPartition(t.topic, p, since_ms) for t in listed if t.error is None
            for p in sorted(t.partitions)]


def _at_end(message: Message) -> bool:
    """Whether `message` says its partition is at its end; any other error raises."""
    error = message.error()
    if error is None:
        return False
    if error.code() == KafkaError._PARTITION_EOF:
        return True
    raise KafkaException(error)


def _record(message: Message) -> TopicRecord:
    raw_id = dict(message.headers() or []).get("message_id")
    return TopicRecord(
        message_id=raw_id.decode(errors="replace") if raw_id else "",
        key=(message.key() or b"").decode(errors="replace"),
        partition=message.partition(), offset=message.offset(),
        timestamp_ms=message.timestamp()[1])


@dataclass(frozen=True, slots=True)
class Reconciliation:
    missing: list[str]  # published in the table, not on the topic
    unknown: list[str]  # on the topic, not in the table
    duplicated: list[tuple[str, int]]  # message id, copies
    out_of_order: list[str]  # keys


def reconcile(table: list[TopicEvent], records: list[TopicRecord],
              in_table: Callable[[list[str]], set[str]]) -> Reconciliation:
    """Compare the window's rows (in stream order) with its records (in partition, offset
    order). `in_table` answers which ids outside the window's rows the outbox holds."""
    on_topic = Counter(r.message_id for r in records)
    rows = {e.id: e for e in table}
    missing = [e.id for e in table if e.published and e.id not in on_topic]
    strangers = [i for i in on_topic if i not in rows]
    known = in_table(strangers) if strangers else set()
    unknown = sorted(i for i in strangers if i not in known)
    duplicated = sorted((i, n) for i, n in on_topic.items() if n > 1)
    return Reconciliation(missing, unknown, duplicated, _out_of_order(table, records, rows))


def _out_of_order(table: list[TopicEvent], records: list[TopicRecord],
                  rows: dict[str, TopicEvent]) -> list[str]:
    """The keys whose rows' first copies on the topic are not in the table's stream order."""
    first_seen: dict[str, list[str]] = defaultdict(list)
    seen: set[str] = set()
    for record in records:
        if record.message_id in rows and record.message_id not in seen:
            seen.add(record.message_id)
            first_seen[rows[record.message_id].key].append(record.message_id)
    expected: dict[str, list[str]] = defaultdict(list)
    for event in table:
        if event.id in seen:
            expected[event.key].append(event.id)
    return sorted(k for k, ids in first_seen.items() if ids != expected[k])
