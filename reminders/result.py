"""What a cycle hands out: its result (the counters of docs/design.md §3.7 and how it
ended), and the observers that watch it (`reminders.observe`), told in plain values."""

import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from core.exit_codes import ExitCode, for_database_failure
from core.failures import DatabaseFailure
from reminders.models import ReminderRun


@dataclass(slots=True)
class CycleResult:
    """The counters of docs/design.md §3.7, and how the cycle ended."""

    run_id: uuid.UUID
    as_of: datetime
    status: str = ReminderRun.Status.RUNNING
    dry_run: bool = False  # the cycle's one record of --dry-run: its ledger and observers read it here
    window_documents: int = 0
    due_documents: int = 0
    reminders_sent: int = 0
    owners_notified: int = 0
    markers_written: int = 0
    markers_rearmed: int = 0
    # owners whose reminder the outbox already held (the same message id): markers written,
    # no second event (a ledger restored or rolled back without its outbox)
    owners_already_queued: int = 0
    skipped_already_marked: int = 0
    pruned: int = 0
    failed_owners: int = 0
    duration_ms: int = 0
    failure: DatabaseFailure | None = None  # why a failed cycle failed (core.failures): `fail`
    owner_failure: DatabaseFailure | None = None  # why the first failed owner failed
    reminders_by_threshold: Counter[int] = field(default_factory=Counter)
    documents_processed: int = 0

    def counters(self) -> dict[str, int]:
        """The counters recorded in the run history."""
        return {
            "reminders_sent": self.reminders_sent,
            "owners_notified": self.owners_notified,
            "markers_written": self.markers_written,
            "markers_rearmed": self.markers_rearmed,
            "owners_already_queued": self.owners_already_queued,
            "skipped_already_marked": self.skipped_already_marked,
            "pruned": self.pruned,
            "failed_owners": self.failed_owners,
        }

    def fail(self, failure: DatabaseFailure) -> None:
        """The cycle failed, for `failure`: its status and its cause set together."""
        self.status = ReminderRun.Status.FAILED
        self.failure = failure

    @property
    def error(self) -> str | None:
        """The run history's `error`: the failure's one line (None if the cycle did not fail)."""
        return self.failure.reason if self.failure else None

    def failure_line(self) -> str | None:
        """The one line a manual run ends with when something failed (None if nothing did):
        what failed first (the database unreachable, a missing table or grant, or another
        database error), and the owners that failed and are retried next cycle."""
        if self.ok:
            return None
        if self.failure is not None:
            owners = (f"; {self.failed_owners} owner(s) failed, they are retried next cycle"
                      if self.failed_owners else "")
            return f"cycle failed: {self.failure.reason}{owners}"
        first = f" ({self.owner_failure.reason})" if self.owner_failure else ""
        return (f"cycle {self.status}: {self.failed_owners} owner(s) failed{first}; "
                "they are retried next cycle")

    @property
    def exit_code(self) -> ExitCode:
        """A manual run's exit code: a failed cycle's by its failure (the database unavailable,
        a table or grant missing, another error), failed owners FAILED (retried next cycle)."""
        if self.ok:
            return ExitCode.OK
        return ExitCode.FAILED if self.failure is None else for_database_failure(self.failure)

    @property
    def ok(self) -> bool:
        """True when nothing failed (a timed-out or stopped cycle is fine: the rest waits)."""
        return self.failed_owners == 0 and self.status != ReminderRun.Status.FAILED


@dataclass(frozen=True, slots=True)
class CycleStart:
    """A cycle as it begins, as its observers see it."""

    run_id: uuid.UUID
    as_of: datetime
    batch_size: int
    thresholds: tuple[int, ...]
    dry_run: bool


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """What one batch did (its owner-by-owner retries included)."""

    documents: int = 0
    reminders_sent: int = 0
    owners_notified: int = 0
    failed_owners: int = 0

    def __add__(self, other: "BatchCounts") -> "BatchCounts":
        return BatchCounts(self.documents + other.documents,
                           self.reminders_sent + other.reminders_sent,
                           self.owners_notified + other.owners_notified,
                           self.failed_owners + other.failed_owners)


@dataclass(frozen=True, slots=True)
class BatchDone:
    """A batch settled, as its observers see it: how many owners it held, what it did, the
    connection it was claimed on (0: the cycle's, 1: the second claim connection) and when its
    claim began (`time.time_ns()`; it ends when its observers are told)."""

    owners: int
    counts: BatchCounts
    connection: int = 0
    started_ns: int = 0


class CycleObserver:
    """Watches a cycle from outside (metrics, tracing, health: `reminders.observe`). Every
    method does nothing here: an observer overrides the ones it needs."""

    def cycle_started(self, cycle: CycleStart) -> Mapping[str, str]:
        """The cycle begins; the headers to add to each of its events (a trace context)."""
        return {}

    def batch_done(self, batch: BatchDone) -> None:
        """A batch is settled: counted, retried owner by owner, or its owners failed. With two
        claim connections batches overlap; each one's values say which it was."""

    def cycle_finished(self, result: CycleResult) -> None:
        """The cycle ended (its status says how; still `running` if an error escaped it)."""
