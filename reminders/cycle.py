"""One reminder cycle (DESIGN 3): census, due owners in urgency order, per-batch claim and
event, owner-by-owner retry on failure, chunked prune, result.

Owners are the unit: a batch holds whole owners (about `batch_size` documents), commits its
markers and events together, and on failure is retried owner by owner so that one failing
owner loses nothing for the others.
"""

import logging
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, NamedTuple

import psycopg
from django.db import Error as DjangoDatabaseError
from django.db import connections, transaction

from reminders import events, rules, store
from reminders.background_log import BackgroundLog
from reminders.config import ReminderSettings
from reminders.logs import log_event
from reminders.models import ReminderRun

logger = logging.getLogger("reminders.cycle")

DatabaseErrors = (psycopg.Error, DjangoDatabaseError)
PRUNE_CHUNK = 5_000
ABANDONED_AFTER_MIN = timedelta(hours=1)

Clock = Callable[[], float]
Progress = Callable[[int, int], None]


@dataclass(slots=True)
class CycleResult:
    """The counters of DESIGN 3 step 7, and how the cycle ended."""

    run_id: uuid.UUID
    as_of: datetime
    status: str = ReminderRun.Status.RUNNING
    dry_run: bool = False
    window_documents: int = 0
    due_documents: int = 0
    reminders_sent: int = 0
    owners_notified: int = 0
    markers_written: int = 0
    markers_rearmed: int = 0
    skipped_already_marked: int = 0
    pruned: int = 0
    failed_owners: int = 0
    duration_ms: int = 0
    error: str | None = None
    reminders_by_threshold: Counter[int] = field(default_factory=Counter)
    owners_processed: int = 0
    documents_processed: int = 0

    def counters(self) -> dict[str, int]:
        """The counters recorded in the run history."""
        return {
            "reminders_sent": self.reminders_sent,
            "owners_notified": self.owners_notified,
            "markers_written": self.markers_written,
            "markers_rearmed": self.markers_rearmed,
            "skipped_already_marked": self.skipped_already_marked,
            "pruned": self.pruned,
            "failed_owners": self.failed_owners,
        }

    @property
    def ok(self) -> bool:
        """True when nothing failed (a timed-out or stopped cycle is fine: the rest waits)."""
        return self.failed_owners == 0 and self.status != ReminderRun.Status.FAILED


@dataclass(frozen=True, slots=True)
class _Queued:
    owner_user_id: uuid.UUID
    document_id: uuid.UUID
    type: str
    threshold_days: int
    days_left: int


@dataclass(slots=True)
class _BatchOutcome:
    markers_won: int = 0
    markers_rearmed: int = 0
    events_written: int = 0
    queued: list[_Queued] = field(default_factory=list)
    due_documents: int = 0


class ConnectionLostError(Exception):
    """The database connection was lost mid-cycle; the cycle ends as failed."""


def _connection_alive(using: str) -> bool:
    wrapper = connections[using]
    raw = wrapper.connection
    return raw is not None and not raw.closed and wrapper.is_usable()


class OwnerBatch(NamedTuple):
    """Whole owners, and how many due documents they have between them."""

    owner_ids: list[uuid.UUID]
    documents: int


def owner_batches(
    rows: Callable[[int], Sequence[tuple[Any, ...]]], batch_size: int
) -> Iterator[OwnerBatch]:
    """Group due-owner rows `(owner, first expiry, due documents)` into batches of about
    `batch_size` documents, never splitting an owner (one with more goes alone)."""
    batch: list[uuid.UUID] = []
    documents = 0
    while chunk := rows(batch_size):
        for owner_id, _first_expiry, due in chunk:
            if batch and documents + int(due) > batch_size:
                yield OwnerBatch(batch, documents)
                batch, documents = [], 0
            batch.append(owner_id)
            documents += int(due)
    if batch:
        yield OwnerBatch(batch, documents)


def most_urgent_per_owner(
    due: list[tuple[store.DocumentRow, rules.Decision]], cap: int
) -> list[tuple[store.DocumentRow, rules.Decision]]:
    """At most `cap` due documents per owner, most urgent first (days left, then id): the
    event stays within a sane size; the rest stay unmarked, due again next cycle."""
    by_owner: dict[uuid.UUID, list[tuple[store.DocumentRow, rules.Decision]]] = {}
    for pair in due:
        by_owner.setdefault(pair[0].owner_user_id, []).append(pair)
    kept: list[tuple[store.DocumentRow, rules.Decision]] = []
    for pairs in by_owner.values():
        kept += pairs if len(pairs) <= cap else sorted(
            pairs, key=lambda p: (p[1].days_left, p[0].id))[:cap]
    return kept


class Cycle:
    """Runs one cycle; build it with the settings and call `run()`."""

    def __init__(
        self,
        settings: ReminderSettings,
        *,
        as_of: datetime | None = None,
        using: str = "default",
        stop: threading.Event | None = None,
        clock: Clock = time.monotonic,
        dry_run: bool = False,
        progress: Progress | None = None,
        extra_headers: dict[str, str] | None = None,
        max_documents_per_event: int = events.MAX_DOCUMENTS_PER_EVENT,
        tick: datetime | None = None,
    ) -> None:
        self.settings = settings
        self.tick = tick  # the loop's tick this cycle runs for; None for a manual run
        self.max_documents_per_event = max_documents_per_event
        self.as_of = (as_of or datetime.now(UTC)).astimezone(UTC)
        self.as_of_date = rules.utc_date(self.as_of)
        self.window = rules.scan_window(
            self.as_of_date, settings.thresholds, settings.retention_days
        )
        self.using = using
        self.stop = stop or threading.Event()
        self.clock = clock
        self.dry_run = dry_run
        self.progress = progress
        self.extra_headers = extra_headers
        self.result = CycleResult(run_id=uuid.uuid4(), as_of=self.as_of, dry_run=dry_run)
        self._deadline = 0.0
        self._reminder_log: BackgroundLog | None = None

    # --- the cycle -------------------------------------------------------------------------

    def run(self) -> CycleResult:
        """Run the cycle to its end (done, timed out, stopped or failed) and return its result."""
        started = self.clock()
        self._deadline = started + self.settings.max_run_duration.total_seconds()
        result = self.result
        log_event(
            logger, logging.INFO, "cycle started",
            run_id=result.run_id, as_of=self.as_of, thresholds=list(self.settings.thresholds),
            batch_size=self.settings.batch_size, dry_run=self.dry_run,
            window=[self.window.first_day, self.window.last_day],
        )
        try:
            with BackgroundLog("reminder-log") as self._reminder_log:
                self._remind_and_prune()
        except (ConnectionLostError, *DatabaseErrors) as exc:
            result.status = ReminderRun.Status.FAILED
            result.error = f"{type(exc).__name__}: {exc}".strip()[:2000]
            log_event(logger, logging.ERROR, "cycle failed", run_id=result.run_id,
                      error=result.error)
        finally:
            self._reminder_log = None
        result.duration_ms = int((self.clock() - started) * 1000)
        self._record_finish()
        log_event(
            logger, logging.INFO, "cycle completed",
            run_id=result.run_id, status=result.status, dry_run=self.dry_run,
            reminders_sent=result.reminders_sent, owners_notified=result.owners_notified,
            markers_written=result.markers_written, markers_rearmed=result.markers_rearmed,
            skipped_already_marked=result.skipped_already_marked, pruned=result.pruned,
            failed_owners=result.failed_owners, duration_ms=result.duration_ms,
            reminders_by_threshold={str(k): v for k, v in sorted(result.reminders_by_threshold.items())},
        )
        return result

    def _remind_and_prune(self) -> None:
        result = self.result
        if not self.dry_run:
            # A killed process never records its end: close such runs once no cycle could
            # still be going (twice the budget, and at least an hour).
            store.close_abandoned_runs(
                self.using, max(2 * self.settings.longest_cycle, ABANDONED_AFTER_MIN))
            store.start_run(
                self.using, result.run_id, self.as_of, self.settings.thresholds,
                socket.gethostname(), tick=self.tick,
            )
        with store.due_owners(
            self.using, self.window, self.settings.thresholds, self.as_of_date
        ) as due:
            result.window_documents, result.due_documents = (
                due.window_documents, due.due_documents)
            result.skipped_already_marked = result.window_documents - result.due_documents
            result.status = self._remind_due_owners(due)
        if result.status in (ReminderRun.Status.SUCCEEDED, ReminderRun.Status.TIMED_OUT):
            # Timed out too: were every cycle to time out, the ledger would grow without bound.
            # Stopped by a signal: the prune is left to the next cycle.
            result.pruned = self._prune()
            if result.failed_owners and result.status == ReminderRun.Status.SUCCEEDED:
                result.status = ReminderRun.Status.PARTIAL

    def _out_of_time(self) -> bool:
        return self.clock() >= self._deadline

    def _remind_due_owners(self, due: store.DueOwners) -> str:
        for owner_ids, documents in owner_batches(due.fetch, self.settings.batch_size):
            if self.stop.is_set():
                log_event(logger, logging.WARNING, "cycle stopping on signal",
                          run_id=self.result.run_id)
                return ReminderRun.Status.STOPPED
            if self._out_of_time():
                log_event(logger, logging.WARNING, "cycle out of time",
                          run_id=self.result.run_id,
                          max_run_duration_s=self.settings.max_run_duration.total_seconds())
                return ReminderRun.Status.TIMED_OUT
            log_event(logger, logging.INFO, "batch selected", run_id=self.result.run_id,
                      owners=len(owner_ids), documents=documents)
            with self.batch_scope(owner_ids):
                self._remind_batch(owner_ids)
            if self.progress:
                self.progress(self.result.documents_processed, self.result.due_documents)
        return ReminderRun.Status.SUCCEEDED

    def batch_scope(self, owner_ids: list[uuid.UUID]) -> AbstractContextManager[object]:
        """Wraps each batch; reminders.tracing overrides it with a child span."""
        return nullcontext()

    def _remind_batch(self, owner_ids: list[uuid.UUID]) -> None:
        try:
            outcome = self._in_transaction(owner_ids)
        except DatabaseErrors:
            if not _connection_alive(self.using):
                self._fail_owners(owner_ids, "connection lost")
                raise ConnectionLostError("database connection lost") from None
            log_event(logger, logging.WARNING, "batch failed, retrying owner by owner",
                      run_id=self.result.run_id, owners=len(owner_ids), exc_info=True)
            for owner_id in owner_ids:
                try:
                    self._account(self._in_transaction([owner_id]), owners=1)
                except DatabaseErrors as exc:
                    self._fail_owners([owner_id], f"{type(exc).__name__}: {exc}".strip())
                    if not _connection_alive(self.using):
                        raise ConnectionLostError("database connection lost") from None
            return
        self._account(outcome, owners=len(owner_ids))

    def _in_transaction(self, owner_ids: list[uuid.UUID]) -> _BatchOutcome:
        if self.dry_run:
            return self._plan_only(owner_ids)
        with transaction.atomic(using=self.using, durable=True):
            return self._claim(owner_ids)

    def _claim(self, owner_ids: list[uuid.UUID]) -> _BatchOutcome:
        # The rules run inside the claim statement (they mirror rules.decide, tested alike),
        # so no document travels to the worker and back: Python stays off the per-row path.
        claimed = store.claim_batch(
            self.using, owner_ids, self.window, self.settings.thresholds, self.as_of_date,
            run_id=self.result.run_id, as_of=self.as_of, extra_headers=self.extra_headers,
            max_documents_per_event=self.max_documents_per_event,
        )
        return _BatchOutcome(
            markers_won=claimed.markers_won,
            markers_rearmed=claimed.markers_rearmed,
            events_written=claimed.events_written,
            queued=[
                _Queued(i.owner_user_id, i.document_id, i.type, i.threshold_days, i.days_left)
                for i in claimed.notified
            ],
            due_documents=claimed.due_documents,
        )

    def _plan_only(self, owner_ids: list[uuid.UUID]) -> _BatchOutcome:
        """--dry-run: what the claim would do, decided by rules.decide, writing nothing."""
        outcome = _BatchOutcome()
        queued: list[_Queued] = []
        documents = store.batch_documents(self.using, owner_ids, self.window)
        due = [(doc, decision) for doc in documents if (decision := rules.decide(
            doc.expires_on, self.as_of_date, self.settings.thresholds, doc.markers)) is not None]
        for doc, decision in most_urgent_per_owner(due, self.max_documents_per_event):
            outcome.due_documents += 1
            outcome.markers_won += len(decision.markers)
            outcome.markers_rearmed += len(decision.rearmed)
            if decision.notify is not None:
                queued.append(_Queued(doc.owner_user_id, doc.id, doc.type, decision.notify,
                                      decision.days_left))
        outcome.queued = queued
        outcome.events_written = len({q.owner_user_id for q in queued})
        return outcome

    def _account(self, outcome: _BatchOutcome, *, owners: int) -> None:
        """Count a committed batch, and log its reminders now that they are durable."""
        result = self.result
        result.owners_processed += owners
        result.documents_processed += outcome.due_documents
        result.markers_written += outcome.markers_won
        result.markers_rearmed += outcome.markers_rearmed
        result.owners_notified += outcome.events_written
        result.reminders_sent += len(outcome.queued)
        queued = sorted(outcome.queued, key=lambda q: (str(q.owner_user_id), q.days_left))
        for item in queued:
            result.reminders_by_threshold[item.threshold_days] += 1
        if self._reminder_log is not None:
            # A line per reminder costs about a third of a batch's time in Python: on the
            # log's thread it overlaps the next batch's statement instead.
            self._reminder_log.submit(lambda: self._log_reminders(queued))
        else:
            self._log_reminders(queued)

    def _log_reminders(self, queued: list[_Queued]) -> None:
        event = "reminder queued" if not self.dry_run else "reminder due"
        for item in queued:
            log_event(
                logger, logging.INFO, event,
                run_id=self.result.run_id, owner_user_id=item.owner_user_id,
                document_id=item.document_id, type=item.type,
                threshold_days=item.threshold_days, days_left=item.days_left,
            )

    def _fail_owners(self, owner_ids: list[uuid.UUID], reason: str) -> None:
        self.result.failed_owners += len(owner_ids)
        for owner_id in owner_ids:
            log_event(logger, logging.ERROR, "owner failed", run_id=self.result.run_id,
                      owner_user_id=owner_id, error=reason[:500])

    def _prune(self) -> int:
        cutoff = rules.prune_cutoff(self.as_of_date, self.settings.retention_days)
        if self.dry_run:
            return store.count_expired_markers(self.using, cutoff)
        # the rest of the cycle's budget, and at least a budget of its own
        until = max(self._deadline, self.clock() + self.settings.prune_budget.total_seconds())
        return prune_expired_markers(
            self.using, cutoff, stop=self.stop, out_of_time=lambda: self.clock() >= until
        )

    def _record_finish(self) -> None:
        if self.dry_run:
            return
        result = self.result
        try:
            if not _connection_alive(self.using):
                connections[self.using].close()
            store.finish_run(
                self.using, result.run_id, status=result.status, counters=result.counters(),
                duration_ms=result.duration_ms, error=result.error,
            )
        except DatabaseErrors:
            log_event(logger, logging.WARNING, "could not record the end of the cycle",
                      run_id=result.run_id, status=result.status)


def delete_in_chunks(
    using: str,
    delete_chunk: Callable[[int], int],
    *,
    chunk: int,
    stop: threading.Event | None = None,
    out_of_time: Callable[[], bool] = lambda: False,
) -> int:
    """Call `delete_chunk(chunk)` in its own transaction until it deletes less than a chunk
    (or the stop or the time budget says so); the total deleted."""
    total = 0
    while not (stop and stop.is_set()) and not out_of_time():
        with transaction.atomic(using=using, durable=True):
            deleted = delete_chunk(chunk)
        total += deleted
        if deleted < chunk:
            break
    return total


def prune_expired_markers(
    using: str,
    cutoff: date,
    *,
    stop: threading.Event | None = None,
    out_of_time: Callable[[], bool] = lambda: False,
    chunk: int = PRUNE_CHUNK,
) -> int:
    """Delete markers expiring before `cutoff` in bounded chunks, one transaction each."""
    total = delete_in_chunks(
        using, lambda size: store.prune_expired_markers(using, cutoff, size),
        chunk=chunk, stop=stop, out_of_time=out_of_time,
    )
    log_event(logger, logging.INFO, "markers pruned", cutoff=cutoff, pruned=total)
    return total


def run_cycle(settings: ReminderSettings, **kwargs: Any) -> CycleResult:
    """Run one cycle with `settings`; keyword arguments as for `Cycle`."""
    return Cycle(settings, **kwargs).run()
