"""One reminder cycle (docs/design.md §3), the orchestration only: census, due owners in
urgency order, per-batch claim and event, owner-by-owner retry on failure, prune, result.

Owners are the unit: a batch holds whole owners (about `batch_size` documents), commits its
markers and events together, and on failure is retried owner by owner so that one failing
owner loses nothing for the others. The claim is `store.claim_batch`; the dry run's plan is
`plan.plan_batch`; the prunes are `retention`'s. An observer (metrics, tracing, health: see
`reminders.observe`) is told when the cycle starts, around each batch, and when it ends.
"""

import logging
import operator
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.db import connections, transaction

from core.db import DatabaseErrors, connection_alive
from core.failures import DatabaseFailure, classify_on
from core.logs import Rows, log_event, log_events
from reminders import events, plan, retention, rules, store
from reminders.config import ReminderSettings
from reminders.models import SUCCESSFUL_STATUSES, ReminderRun
from reminders.result import CycleObserver, CycleResult, Unobserved

logger = logging.getLogger("reminders.cycle")

ABANDONED_AFTER_MIN = timedelta(hours=1)

Clock = Callable[[], float]
Progress = Callable[[int, int], None]


class ConnectionLostError(ConnectionError):
    """The database connection was lost mid-cycle; the cycle ends as failed."""


class OwnerBatch(NamedTuple):
    """Whole owners, and how many due documents they have between them."""

    owners: list[store.DueOwner]
    documents: int

    @property
    def owner_ids(self) -> list[uuid.UUID]:
        return [owner.owner_user_id for owner in self.owners]


def owner_batches(
    rows: Callable[[int], Sequence[store.DueOwner]], batch_size: int
) -> Iterator[OwnerBatch]:
    """Group due owners into batches of about `batch_size` documents, never splitting an
    owner (one with more goes alone)."""
    batch: list[store.DueOwner] = []
    documents = 0
    while chunk := rows(batch_size):
        for owner in chunk:
            if batch and documents + owner.due_documents > batch_size:
                yield OwnerBatch(batch, documents)
                batch, documents = [], 0
            batch.append(owner)
            documents += owner.due_documents
    if batch:
        yield OwnerBatch(batch, documents)


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
        observer: CycleObserver | None = None,
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
        self.observer: CycleObserver = observer or Unobserved()
        self.result = CycleResult(run_id=uuid.uuid4(), as_of=self.as_of, dry_run=dry_run)
        self._deadline = 0.0

    # --- the cycle -------------------------------------------------------------------------

    def run(self) -> CycleResult:
        """Run the cycle to its end (done, timed out, stopped or failed) and return its result."""
        try:
            if headers := self.observer.cycle_started(self):
                self.extra_headers = {**(self.extra_headers or {}), **headers}
            return self._run()
        finally:
            self.observer.cycle_finished(self.result)

    def _run(self) -> CycleResult:
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
            self._remind_and_prune()
        except (ConnectionLostError, *DatabaseErrors) as exc:
            result.status = ReminderRun.Status.FAILED
            result.failure = classify_on(exc, self.using)
            result.error = result.failure.reason
            log_event(logger, logging.ERROR, "cycle failed", run_id=result.run_id,
                      **result.failure.fields())
        result.duration_ms = int((self.clock() - started) * 1000)
        self._record_finish()
        self._prune_run_history()
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
        for batch in owner_batches(due.fetch, self.settings.batch_size):
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
                      owners=len(batch.owners), documents=batch.documents)
            with self.observer.batch(self, batch.owner_ids):
                self._remind_batch(batch.owners)
            if self.progress:
                self.progress(self.result.documents_processed, self.result.due_documents)
        return ReminderRun.Status.SUCCEEDED

    def _remind_batch(self, owners: list[store.DueOwner]) -> None:
        try:
            outcome = self._in_transaction(owners)
        except DatabaseErrors:
            owner_ids = [owner.owner_user_id for owner in owners]
            if not connection_alive(self.using):
                lost = ConnectionLostError("database connection lost")
                self._fail_owners(owner_ids, classify_on(lost, self.using))
                raise lost from None
            log_event(logger, logging.WARNING, "batch failed, retrying owner by owner",
                      run_id=self.result.run_id, owners=len(owners), exc_info=True)
            for owner in owners:
                try:
                    self._account(self._in_transaction([owner]), owners=1)
                except DatabaseErrors as exc:
                    self._fail_owners([owner.owner_user_id], classify_on(exc, self.using))
                    if not connection_alive(self.using):
                        raise ConnectionLostError("database connection lost") from None
            return
        self._account(outcome, owners=len(owners))

    def _in_transaction(self, owners: list[store.DueOwner]) -> store.BatchClaim:
        if self.dry_run:
            return plan.plan_batch(
                self.using, [owner.owner_user_id for owner in owners], self.window,
                self.settings.thresholds, self.as_of_date,
                max_documents_per_event=self.max_documents_per_event)
        # An owner's most urgent documents only: the rest stay unmarked, due next cycle.
        cap = self.max_documents_per_event
        document_ids = sorted(doc for owner in owners for doc in owner.document_ids[:cap])
        with transaction.atomic(using=self.using, durable=True):
            # The rules run inside the claim statement (they mirror rules.decide, tested
            # alike), so no document travels to the worker and back (only the due
            # documents' ids, from the due-owners pass).
            return store.claim_batch(
                self.using, document_ids, self.window, self.settings.thresholds, self.as_of_date,
                run_id=self.result.run_id, as_of=self.as_of, extra_headers=self.extra_headers,
            )

    def _account(self, outcome: store.BatchClaim, *, owners: int) -> None:
        """Count a committed batch, and log its reminders now that they are durable."""
        result = self.result
        result.owners_processed += owners
        result.documents_processed += outcome.due_documents
        result.markers_written += outcome.markers_won
        result.markers_rearmed += outcome.markers_rearmed
        result.owners_notified += outcome.events_written
        result.reminders_sent += len(outcome.notified)
        result.reminders_by_threshold.update(
            map(operator.itemgetter(store.THRESHOLD_DAYS), outcome.notified))
        # A line per reminder, rendered from the claim's rows and written by the logging
        # thread (core.logs) while the next batch's statement runs: one record a batch.
        log_events(
            logger, logging.INFO, "reminder queued" if not self.dry_run else "reminder due",
            Rows(store.NOTIFIED_FIELDS, outcome.notified), run_id=self.result.run_id,
        )

    def _fail_owners(self, owner_ids: list[uuid.UUID], failure: DatabaseFailure) -> None:
        self.result.failed_owners += len(owner_ids)
        self.result.owner_failure = self.result.owner_failure or failure
        for owner_id in owner_ids:
            log_event(logger, logging.ERROR, "owner failed", run_id=self.result.run_id,
                      owner_user_id=owner_id, **failure.fields())

    def _prune(self) -> int:
        cutoff = rules.prune_cutoff(self.as_of_date, self.settings.retention_days)
        if self.dry_run:
            return store.count_expired_markers(self.using, cutoff)
        # the rest of the cycle's budget, and at least a budget of its own
        until = max(self._deadline, self.clock() + self.settings.prune_budget.total_seconds())
        return retention.prune_expired_markers(
            self.using, cutoff, stop=self.stop, out_of_time=lambda: self.clock() >= until
        )

    def _prune_run_history(self) -> None:
        """After a cycle that did its work, the run history's own prune (its failure waits
        for the next cycle)."""
        if self.dry_run or self.result.status not in SUCCESSFUL_STATUSES:
            return
        try:
            retention.prune_run_history(self.using, retention.run_history_age(self.settings))
        except DatabaseErrors as exc:
            log_event(logger, logging.WARNING, "run history prune failed; retried next cycle",
                      error=type(exc).__name__)

    def _record_finish(self) -> None:
        if self.dry_run:
            return
        result = self.result
        try:
            if not connection_alive(self.using):
                connections[self.using].close()
            store.finish_run(
                self.using, result.run_id, status=result.status, counters=result.counters(),
                duration_ms=result.duration_ms, error=result.error,
            )
        except DatabaseErrors:
            log_event(logger, logging.WARNING, "could not record the end of the cycle",
                      run_id=result.run_id, status=result.status)


def run_cycle(settings: ReminderSettings, **kwargs: Any) -> CycleResult:
    """Run one cycle with `settings`; keyword arguments as for `Cycle`."""
    return Cycle(settings, **kwargs).run()
