"""What batches did: one batch's outcome, a relay's running totals, and `Tally`, which says and
counts each recorded batch (the log, the metrics, the outage log) for both lanes."""

import logging
import random
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from confluent_kafka import KafkaError

from core.supervise import backoff_delay
from outbox import metrics
from outbox.config import RelaySettings
from outbox.kafka_errors import describe
from outbox.outage import Emit, OutageLog, Partition, PartitionOutages
from outbox.store import ReadMessage


@dataclass(slots=True)
class Deliveries:
    """Rows read and produced (`read`), and what became of them."""

    read: int = 0
    published: int = 0
    released: int = 0
    failed: int = 0
    deferred: int = 0  # left for the slow lane, or delayed there: their partition was down

    def add_deliveries(self, other: "Deliveries") -> None:
        self.read += other.read
        self.published += other.published
        self.released += other.released
        self.failed += other.failed
        self.deferred += other.deferred


@dataclass(slots=True)
class BatchOutcome(Deliveries):
    """What one batch (or a run of batches) did."""

    parked: list[uuid.UUID] = field(default_factory=list)

    @property
    def broker_unavailable(self) -> bool:
        return self.released > 0

    def merge(self, other: "BatchOutcome") -> None:
        self.add_deliveries(other)
        self.parked.extend(other.parked)


@dataclass(slots=True)
class RelayStats(Deliveries):
    """Running totals of a relay, for the command's summary, logs and tests."""

    batches: int = 0
    parked: int = 0
    pruned: int = 0
    stood_by: bool = False  # another relay was leading when this one looked for work
    broker_answered: bool = True  # a pass's metadata request (check_broker) had an answer
    # How long a pass waited for stream rows held back by a transaction open on the server,
    # when they were still held at its bound (0: none were left held back).
    held_for_s: float = 0.0
    # Seconds waited after each consecutive "broker unavailable" or database failure.
    backoffs: list[float] = field(default_factory=list)

    def add(self, outcome: BatchOutcome) -> None:
        self.batches += 1
        self.add_deliveries(outcome)
        self.parked += len(outcome.parked)


class Tally:
    """Says and counts what each recorded batch did, and when a refused row is tried again."""

    def __init__(self, settings: RelaySettings, stats: RelayStats, outage: OutageLog, *,
                 emit: Emit, stop: threading.Event, rng: random.Random,
                 refused: Callable[[], bool], reached_kafka: Callable[[], None],
                 on_batch: Callable[[RelayStats], object] | None = None) -> None:
        self.settings = settings
        self.stats = stats
        self._outage = outage
        self._emit = emit
        self._stop = stop
        self._rng = rng
        self._refused = refused  # the broker refused the relay: its line says it all
        self._reached_kafka = reached_kafka
        self.on_batch = on_batch  # told the running totals after each batch (a progress bar)
        self.partitions = PartitionOutages(
            emit, interval_s=settings.outage_log_interval.total_seconds())

    def describe_refusal(self, message: ReadMessage, error: KafkaError) -> tuple[str, timedelta]:
        """A row the broker refused: its error and retry delay to record, said in a line."""
        delay = backoff_delay(message.attempts + 1, self.settings.backoff_initial,
                              self.settings.backoff_max, self._rng)
        self._emit(logging.WARNING, "message not delivered", {
            "message_id": message.id, "attempt": message.attempts + 1,
            "error": describe(error), "retry_in_s": round(delay, 3)})
        return describe(error), timedelta(seconds=delay)

    def describe_deferrals(self, deferred: Sequence[tuple[ReadMessage, KafkaError]],
                           partitions: Mapping[str, int]) -> dict[str, tuple[str, timedelta]]:
        """Rows their partition could not take now (`partitions`: by key, as reported): for each
        (by id) its error and retry delay, the partition's backoff, which grows with the batches
        it failed in a row; said in that partition's outage log and metrics."""
        by_partition: dict[Partition, list[tuple[ReadMessage, KafkaError]]] = {}
        for message, error in deferred:
            where = (message.topic, partitions.get(message.key, -1))
            by_partition.setdefault(where, []).append((message, error))
        described: dict[str, tuple[str, timedelta]] = {}
        for where, rows in by_partition.items():
            failures = self.partitions.failed(where, (m.key for m, _e in rows),
                                              describe(rows[0][1]))
            metrics.record_deferred(*where, len(rows))
            for message, error in rows:
                delay = backoff_delay(failures, self.settings.backoff_initial,
                                      self.settings.backoff_max, self._rng)
                described[message.id] = (describe(error), timedelta(seconds=delay))
        return described

    def delivered(self, keys: Iterable[str]) -> None:
        """Rows of `keys` delivered: a partition they had been deferred for is back."""
        for topic, partition in self.partitions.delivered(keys):
            metrics.set_partition_available(topic, partition)

    def unrecorded(self, outcome: BatchOutcome) -> None:
        """A batch whose rows are read again (the batch before it stopped short)."""
        self.stats.add(outcome)

    def account(self, outcome: BatchOutcome, first_unavailable: KafkaError | None, *,
                lane: str) -> BatchOutcome:
        """Say and count what a recorded batch did."""
        for message_id in outcome.parked:
            self._emit(logging.ERROR, "message parked",
                       {"message_id": message_id, "attempts": self.settings.max_attempts})
        if outcome.published:
            self._reached_kafka()
        if outcome.released and not self._refused():
            error_text = describe(first_unavailable) if first_unavailable else "no report"
            if self._stop.is_set():  # the shutdown grace ran out, not necessarily the broker
                self._emit(logging.WARNING, "messages released at stop",
                           {"released": outcome.released, "error": error_text})
            else:
                self._outage.failed(error_text, released=outcome.released)
        self._emit(logging.DEBUG, "batch done", {
            "lane": lane, "read": outcome.read, "published": outcome.published,
            "released": outcome.released, "failed": outcome.failed,
            "deferred": outcome.deferred, "parked": len(outcome.parked)})
        self.stats.add(outcome)
        if self.on_batch is not None:
            self.on_batch(self.stats)
        metrics.record_published(outcome.published)
        metrics.record_failed(outcome.failed)
        metrics.record_parked(len(outcome.parked))
        return outcome
