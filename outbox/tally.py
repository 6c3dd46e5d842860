"""What batches did: one batch's outcome, a relay's running totals, and `Tally`, which says and
counts each recorded batch (the log, the metrics) for both lanes. When a row is tried again is
outbox.retries'; what a batch says of Kafka is the producer's (RelayProducer.batch_recorded)."""

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from outbox import metrics
from outbox.config import Emit


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
    # Of the parked, those whose topic is not on OUTBOX_TOPICS (never sent): id -> topic.
    off_allowlist: dict[uuid.UUID, str] = field(default_factory=dict)

    @property
    def broker_unavailable(self) -> bool:
        return self.released > 0

    def merge(self, other: "BatchOutcome") -> None:
        self.add_deliveries(other)
        self.parked.extend(other.parked)
        self.off_allowlist.update(other.off_allowlist)


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
    """Says and counts what each recorded batch did: its log lines, the running totals, the
    metrics."""

    def __init__(self, stats: RelayStats, *, emit: Emit,
                 on_batch: Callable[[RelayStats], object] | None = None) -> None:
        self.stats = stats
        self._emit = emit
        self.on_batch = on_batch  # told the running totals after each batch (a progress bar)

    def unrecorded(self, outcome: BatchOutcome) -> None:
        """A batch whose rows are read again (the batch before it stopped short)."""
        self.stats.add(outcome)

    def account(self, outcome: BatchOutcome, *, lane: str, max_attempts: int) -> BatchOutcome:
        """Say and count what a recorded batch did (its parked rows had `max_attempts`, or their
        topic is not on OUTBOX_TOPICS)."""
        for message_id in outcome.parked:
            topic = outcome.off_allowlist.get(message_id)
            if topic is None:
                self._emit(logging.ERROR, "message parked",
                           {"message_id": message_id, "attempts": max_attempts})
            else:
                self._emit(logging.ERROR, "message parked, its topic is not on OUTBOX_TOPICS",
                           {"message_id": message_id, "topic": topic})
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
