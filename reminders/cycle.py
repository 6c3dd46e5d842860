"""One reminder cycle (docs/design.md §3), the orchestration only: census, due owners in
urgency order, per-batch claim and event, owner-by-owner retry on failure, prune, result.

Owners are the unit: a batch holds whole owners (about `batch_size` documents), commits its
markers and events together, and on failure is retried owner by owner so that one failing
owner loses nothing for the others. What each step does to the ledger is `reminders.ledger`'s
(written, or the dry run's plan); which connection claims which batch, and the order their
outcomes come back in, is `reminders.claim_connections`' (on two claim connections, batches go
in pairs). Every outcome is settled in one loop, on the cycle's thread: counted, retried, or
its owners failed; a lost connection ends the cycle as failed once the batch in flight is
settled. An observer (metrics, tracing, health: see `reminders.observe`) is told, in plain
values, when the cycle starts, each batch settled, and when it ends.
"""

import logging
import operator
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from core.db import DatabaseErrors
from core.failures import DatabaseFailure, classify_on
from core.logs import Rows, log_event, log_events
from reminders import events, rules, store
from reminders.claim_connections import (
    AliasConnections,
    ClaimOutcome,
    ConnectionLostError,
    CycleConnections,
    DueOwnerRows,
    claimed,
    open_second_connection,
)
from reminders.config import ReminderSettings
from reminders.ledger import DryRun, Ledger, Scope, Writes
from reminders.models import ReminderRun
from reminders.result import BatchCounts, BatchDone, CycleObserver, CycleResult, CycleStart

logger = logging.getLogger("reminders.cycle")

Clock = Callable[[], float]
Progress = Callable[[int, int], None]


class OwnerBatch(NamedTuple):
    """Whole owners, and how many due documents they have between them."""

    owners: list[store.DueOwner]
    documents: int


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
    """Runs one cycle; build it with the settings and call `run()`. `ledger` and `connections`
    are the database's unless given (the Writes or DryRun ledger, the alias's connections)."""

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
        max_documents_per_event: int = events.MAX_DOCUMENTS_PER_EVENT,
        observer: CycleObserver | None = None,
        tick: datetime | None = None,
        ledger: Ledger | None = None,
        connections: CycleConnections | None = None,
    ) -> None:
        as_of = (as_of or datetime.now(UTC)).astimezone(UTC)
        self.scope = Scope(
            settings=settings, using=using, run_id=uuid.uuid4(), as_of=as_of,
            window=rules.scan_window(rules.utc_date(as_of), settings.thresholds,
                                     settings.retention_days),
            max_documents_per_event=max_documents_per_event, tick=tick,
        )
        self.stop = stop or threading.Event()
        self.clock = clock
        self.progress = progress
        self.observer = observer or CycleObserver()
        self.result = CycleResult(run_id=self.scope.run_id, as_of=as_of, dry_run=dry_run)
        self.connections = connections or AliasConnections(using)
        self._ledger = ledger
        self._here = self.connections.cycle_session()
        self._deadline = 0.0
        self._status: str = ReminderRun.Status.SUCCEEDED  # how the batches ended
        self._failure: BaseException | None = None  # what ends the cycle once it is settled

    # --- the cycle -------------------------------------------------------------------------

    def run(self) -> CycleResult:
        """Run the cycle to its end (done, timed out, stopped or failed) and return its result."""
        try:
            scope = self.scope
            start = CycleStart(scope.run_id, scope.as_of, scope.settings.batch_size,
                               tuple(scope.settings.thresholds), self.result.dry_run)
            headers = self.observer.cycle_started(start)  # a trace context, into every event
            ledger: Ledger = self._ledger or (
                DryRun(scope) if self.result.dry_run else Writes(scope, headers))
            return self._run(ledger)
        finally:
            self.observer.cycle_finished(self.result)

    def _run(self, ledger: Ledger) -> CycleResult:
        scope, settings = self.scope, self.scope.settings
        started = self.clock()
        self._deadline = started + settings.max_run_duration.total_seconds()
        result = self.result
        log_event(
            logger, logging.INFO, "cycle started",
            run_id=result.run_id, as_of=scope.as_of, thresholds=list(settings.thresholds),
            batch_size=settings.batch_size, dry_run=result.dry_run,
            window=[scope.window.first_day, scope.window.last_day],
        )
        try:
            self._remind_and_prune(ledger)
        except (ConnectionLostError, *DatabaseErrors) as exc:
            failure = self._classify(exc)
            result.fail(failure)
            log_event(logger, logging.ERROR, "cycle failed", run_id=result.run_id,
                      **failure.fields())
        result.duration_ms = int((self.clock() - started) * 1000)
        ledger.finish(result)
        log_event(
            logger, logging.INFO, "cycle completed",
            run_id=result.run_id, status=result.status, dry_run=result.dry_run,
            reminders_sent=result.reminders_sent, owners_notified=result.owners_notified,
            markers_written=result.markers_written, markers_rearmed=result.markers_rearmed,
            owners_already_queued=result.owners_already_queued,
            skipped_already_marked=result.skipped_already_marked, pruned=result.pruned,
            failed_owners=result.failed_owners, duration_ms=result.duration_ms,
            reminders_by_threshold={str(k): v for k, v in sorted(result.reminders_by_threshold.items())},
        )
        return result

    def _remind_and_prune(self, ledger: Ledger) -> None:
        result, scope = self.result, self.scope
        self.connections.refuse_a_transaction_pooler(scope.run_id)
        ledger.start()
        with self.connections.due_owners(
            scope.window, scope.settings.thresholds, scope.as_of_date, run_id=scope.run_id,
            page_owners=store.DUE_PAGE_BATCHES * scope.settings.batch_size,
        ) as due:
            result.window_documents, result.due_documents = (
                due.window_documents, due.due_documents)
            result.skipped_already_marked = result.window_documents - result.due_documents
            result.status = self._remind_due_owners(ledger, due)
        if result.status in (ReminderRun.Status.SUCCEEDED, ReminderRun.Status.TIMED_OUT):
            # Timed out too, or a ledger whose every cycle times out grows without bound; the
            # prune gets the rest of the cycle's budget, and at least a budget of its own.
            until = max(self._deadline,
                        self.clock() + scope.settings.prune_budget.total_seconds())
            result.pruned = ledger.prune(self.stop, lambda: self.clock() >= until)
            if result.failed_owners and result.status == ReminderRun.Status.SUCCEEDED:
                result.status = ReminderRun.Status.PARTIAL

    def _remind_due_owners(self, ledger: Ledger, due: DueOwnerRows) -> str:
        """The one loop: each batch's outcome, as `claim_connections.claimed` hands them,
        settled, told to the observer and counted on this thread. Ends with the status the
        batches ended with, or raises what failed the cycle's connection."""
        with open_second_connection(self.connections, ledger.claim, run_id=self.scope.run_id,
                                    wanted=self.scope.settings.claim_connections) as second:
            for outcome in claimed(self._batches(due), ledger.claim, self._here, second):
                counts = self._settle(ledger, outcome)
                self.observer.batch_done(BatchDone(len(outcome.owners), counts,
                                                   outcome.connection, outcome.started_ns))
                self._counted()
        if self._failure is not None:
            raise self._failure
        return self._status

    def _batches(self, due: DueOwnerRows) -> Iterator[list[store.DueOwner]]:
        """The batches to claim, each read when it is to start: none once the cycle's
        connection has failed, or the stop or the deadline is seen (the status to end with)."""
        batches = owner_batches(due.fetch, self.scope.settings.batch_size)
        while self._failure is None:
            try:
                batch = next(batches, None)
            except DatabaseErrors as exc:  # the due owners' read: the batch in flight settles
                self._failure = exc
                return
            if batch is None:
                return
            if (stopping := self._stopping()) is not None:
                self._status = stopping
                return
            log_event(logger, logging.INFO, "batch selected", run_id=self.result.run_id,
                      owners=len(batch.owners), documents=batch.documents)
            yield batch.owners

    def _out_of_time(self) -> bool:
        return self.clock() >= self._deadline

    def _stopping(self) -> str | None:
        """The status to end with before the next batch starts (stopped, out of time), if any."""
        if self.stop.is_set():
            log_event(logger, logging.WARNING, "cycle stopping on signal",
                      run_id=self.result.run_id)
            return ReminderRun.Status.STOPPED
        if self._out_of_time():
            log_event(logger, logging.WARNING, "cycle out of time",
                      run_id=self.result.run_id,
                      max_run_duration_s=self.scope.settings.max_run_duration.total_seconds())
            return ReminderRun.Status.TIMED_OUT
        return None

    def _counted(self) -> None:
        if self.progress:
            self.progress(self.result.documents_processed, self.result.due_documents)

    def _settle(self, ledger: Ledger, outcome: ClaimOutcome) -> BatchCounts:
        """A batch's outcome counted: committed, accounted; rolled back, retried owner by owner
        on the cycle's connection; its connection lost, or the cycle's failed meanwhile, its
        owners failed (no retry)."""
        if not isinstance(outcome.result, Exception):
            return self._account(ledger, outcome.result)
        error = outcome.result
        if outcome.connection_lost:
            return self._fail_owners(outcome.owners, self._classify(self._lose(error)))
        if self._failure is not None:
            return self._fail_owners(outcome.owners, self._classify(error))
        log_event(logger, logging.WARNING, "batch failed, retrying owner by owner",
                  run_id=self.result.run_id, owners=len(outcome.owners), exc_info=error)
        return self._retry_owner_by_owner(ledger, outcome.owners)

    def _retry_owner_by_owner(self, ledger: Ledger, owners: list[store.DueOwner]) -> BatchCounts:
        """A failed batch's owners, each in its own transaction on the cycle's connection, until
        that is lost."""
        counts = BatchCounts()
        for owner in owners:
            outcome = self._here.claim(ledger.claim, [owner])
            if not isinstance(outcome.result, Exception):
                counts += self._account(ledger, outcome.result)
                continue
            counts += self._fail_owners([owner], self._classify(outcome.result))
            if outcome.connection_lost:
                self._lose(outcome.result)
                break
        return counts

    def _lose(self, cause: Exception) -> ConnectionLostError:
        """A claim's connection was lost: the cycle fails with it once the batch in flight is
        settled (the first failure stands)."""
        lost = ConnectionLostError.after(cause)
        self._failure = self._failure or lost
        return lost

    def _classify(self, error: BaseException) -> DatabaseFailure:
        return classify_on(error, self.scope.using)

    def _account(self, ledger: Ledger, outcome: store.BatchClaim) -> BatchCounts:
        """Count a committed batch, and log its reminders now that they are durable."""
        result = self.result
        result.documents_processed += outcome.due_documents
        result.markers_written += outcome.markers_won
        result.markers_rearmed += outcome.markers_rearmed
        result.owners_notified += outcome.events_written
        result.owners_already_queued += outcome.owners_already_queued
        if outcome.owners_already_queued:
            log_event(logger, logging.WARNING, "reminders already queued",
                      run_id=result.run_id, owners=outcome.owners_already_queued)
        result.reminders_sent += len(outcome.notified)
        result.reminders_by_threshold.update(
            map(operator.itemgetter(store.THRESHOLD_DAYS), outcome.notified))
        # A line per reminder, rendered from the claim's rows and written by the logging
        # thread (core.logs) while the next batch's statement runs: one record a batch.
        log_events(logger, logging.INFO, ledger.reminder_event,
                   Rows(store.NOTIFIED_FIELDS, outcome.notified), run_id=self.result.run_id)
        return BatchCounts(documents=outcome.due_documents, reminders_sent=len(outcome.notified),
                           owners_notified=outcome.events_written)

    def _fail_owners(self, owners: list[store.DueOwner], failure: DatabaseFailure) -> BatchCounts:
        self.result.failed_owners += len(owners)
        self.result.owner_failure = self.result.owner_failure or failure
        for owner in owners:
            log_event(logger, logging.ERROR, "owner failed", run_id=self.result.run_id,
                      owner_user_id=owner.owner_user_id, **failure.fields())
        return BatchCounts(failed_owners=len(owners))


def run_cycle(settings: ReminderSettings, **kwargs: Any) -> CycleResult:
    """Run one cycle with `settings`; keyword arguments as for `Cycle`."""
    return Cycle(settings, **kwargs).run()
