"""One reminder cycle (docs/design.md §3), the orchestration only: census, due owners in
urgency order, per-batch claim and event, owner-by-owner retry on failure, prune, result.

Owners are the unit: a batch holds whole owners (about `batch_size` documents), commits its
markers and events together, and on failure is retried owner by owner so that one failing
owner loses nothing for the others. What each step does to the ledger is `reminders.ledger`'s
(written, or the dry run's plan). On two claim connections (`REMINDER_CLAIM_CONNECTIONS=2`)
batches go in pairs, one sent to `reminders.claim_connections`'s connection while the other is claimed on
the cycle's; every batch is counted here, on the cycle's thread. An observer (metrics,
tracing, health: see `reminders.observe`) is told, in plain values, when the cycle starts,
around each batch, and when it ends.
"""

import logging
import operator
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg

from core.config import ConfigError
from core.db import (
    DatabaseErrors,
    connection_alive,
    raw_connection,
    session_lost,
    transaction_pooler_in_the_way,
)
from core.failures import DatabaseFailure, classify_on
from core.logs import Rows, log_event, log_events
from reminders import events, rules, store
from reminders.claim_connections import ClaimLane, LaneOutcome
from reminders.config import ReminderSettings
from reminders.ledger import DryRun, Ledger, Scope, Writes
from reminders.models import ReminderRun
from reminders.result import BatchCounts, CycleObserver, CycleResult, CycleStart

logger = logging.getLogger("reminders.cycle")

Clock = Callable[[], float]
Progress = Callable[[int, int], None]


class ConnectionLostError(ConnectionError):
    """The database connection was lost mid-cycle; the cycle ends as failed."""


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


class SentBatch(NamedTuple):
    """A batch in flight on the claim lane: its owners, what it will come to, and its
    observer's wrap (a span), closed when it is settled."""

    owners: list[store.DueOwner]
    outcome: "Future[LaneOutcome]"
    span: ExitStack


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
        max_documents_per_event: int = events.MAX_DOCUMENTS_PER_EVENT,
        observer: CycleObserver | None = None,
        tick: datetime | None = None,
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
        self._deadline = 0.0
        self._two_connections = False  # claiming on two connections (watching each session)

    # --- the cycle -------------------------------------------------------------------------

    def run(self) -> CycleResult:
        """Run the cycle to its end (done, timed out, stopped or failed) and return its result."""
        try:
            scope = self.scope
            start = CycleStart(scope.run_id, scope.as_of, scope.settings.batch_size,
                               tuple(scope.settings.thresholds), self.result.dry_run)
            headers = self.observer.cycle_started(start)  # a trace context, into every event
            ledger: Ledger = DryRun(scope) if self.result.dry_run else Writes(scope, headers)
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
            failure = classify_on(exc, scope.using)
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
        self._refuse_a_transaction_pooler()
        ledger.start()
        with store.due_owners(
            scope.using, scope.window, scope.settings.thresholds, scope.as_of_date,
            run_id=scope.run_id,
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

    def _refuse_a_transaction_pooler(self) -> None:
        """Before anything is written: where the alias holds its session across transactions
        (DATABASE_POOL_MODE=session, the default) and the due owners' cursor with it, a pooler
        that pools by transaction would drop that cursor mid-cycle; a ConfigError naming
        DATABASE_POOL_MODE (exit 2) instead. Without a second connection to probe with (the
        server's or the pooler's limit) the cycle goes on, as it did before the probe."""
        using = self.scope.using
        if not store.holds_sessions(using):
            return  # by pages, nothing held: a transaction pooler is fine
        raw_connection(using)  # the cycle's own session: if that fails, the cycle does
        try:
            pid = transaction_pooler_in_the_way(using)
        except DatabaseErrors as exc:
            log_event(logger, logging.WARNING, "transaction pooler probe skipped: no second "
                      "connection", run_id=self.result.run_id, error=type(exc).__name__)
            return
        if pid is not None:
            raise ConfigError(
                "DATABASE_POOL_MODE",
                f"unset or session, but the worker's session and another one both reached "
                f"server process {pid}: a connection pooler that pools by transaction "
                "(PgBouncer pool_mode=transaction) is between the worker and PostgreSQL; set "
                "DATABASE_POOL_MODE=transaction (the cycle then reads its due owners by pages), "
                "or connect directly or through session pooling; nothing was written")

    def _out_of_time(self) -> bool:
        return self.clock() >= self._deadline

    def _remind_due_owners(self, ledger: Ledger, due: store.DueOwners | store.DuePages) -> str:
        if self.scope.settings.claim_connections == 1:
            return self._remind_on_one_connection(ledger, due)
        try:
            lane = ClaimLane.open(self.scope.using, ledger.claim)
        except DatabaseErrors as exc:
            # No second connection (the server's or the pooler's limit): the cycle's one does.
            log_event(logger, logging.WARNING, "second claim connection unavailable, claiming on"
                      " one", run_id=self.result.run_id, error=type(exc).__name__)
            return self._remind_on_one_connection(ledger, due)
        with lane:
            return self._remind_on_two_connections(ledger, due, lane)

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

    def _selected(self, batch: OwnerBatch) -> None:
        log_event(logger, logging.INFO, "batch selected", run_id=self.result.run_id,
                  owners=len(batch.owners), documents=batch.documents)

    def _counted(self) -> None:
        if self.progress:
            self.progress(self.result.documents_processed, self.result.due_documents)

    def _remind_on_one_connection(self, ledger: Ledger,
                                  due: store.DueOwners | store.DuePages) -> str:
        for batch in owner_batches(due.fetch, self.scope.settings.batch_size):
            if (status := self._stopping()) is not None:
                return status
            self._selected(batch)
            with self.observer.batch(len(batch.owners)):
                self.observer.batch_done(self._remind_batch(ledger, batch.owners))
            self._counted()
        return ReminderRun.Status.SUCCEEDED

    def _remind_on_two_connections(self, ledger: Ledger, due: store.DueOwners | store.DuePages,
                                   lane: ClaimLane) -> str:
        """Batches go in pairs: the first is sent to the lane, the second claimed here while it
        runs (retried owner by owner here if it fails), then the lane's is settled. Every batch
        is counted on this thread; no batch starts once the stop or the deadline is seen."""
        self._two_connections = True
        sent: SentBatch | None = None
        status: str = ReminderRun.Status.SUCCEEDED
        try:
            for batch in owner_batches(due.fetch, self.scope.settings.batch_size):
                if (stopping := self._stopping()) is not None:
                    status = stopping
                    break
                self._selected(batch)
                if sent is None:
                    sent = self._send(lane, batch.owners)
                    continue
                with self.observer.batch(len(batch.owners)):
                    self.observer.batch_done(self._remind_batch(ledger, batch.owners))
                self._counted()
                settling, sent = sent, None
                self._settle(ledger, settling)
        except BaseException:
            if sent is not None:
                self._settle_after_failure(ledger, sent)
            raise
        if sent is not None:
            self._settle(ledger, sent)
        return status

    def _send(self, lane: ClaimLane, owners: list[store.DueOwner]) -> "SentBatch":
        span = ExitStack()
        span.enter_context(self.observer.batch(len(owners), lane=1))
        try:
            return SentBatch(owners, lane.send(owners), span)
        except BaseException:
            span.close()
            raise

    def _settle(self, ledger: Ledger, sent: "SentBatch") -> None:
        """The lane's batch, once done: counted if it committed; if it rolled back, retried
        owner by owner on this connection; a lost lane connection fails the cycle."""
        with sent.span:
            outcome = sent.outcome.result()
            if outcome.claim is not None:
                counts = self._account(ledger, outcome.claim)
            elif outcome.connection_lost:
                lost = ConnectionLostError("database connection lost")
                self._fail_owners(sent.owners, classify_on(lost, self.scope.using))
                raise lost from outcome.error
            else:
                log_event(logger, logging.WARNING, "batch failed, retrying owner by owner",
                          run_id=self.result.run_id, owners=len(sent.owners),
                          exc_info=outcome.error)
                counts = self._retry_owner_by_owner(ledger, sent.owners)
            self.observer.batch_done(counts)
        self._counted()

    def _settle_after_failure(self, ledger: Ledger, sent: "SentBatch") -> None:
        """The lane's batch while the cycle fails: waited for, counted if it committed, its
        owners failed if not (no retry: the cycle's connection may be gone)."""
        with sent.span:
            outcome = sent.outcome.result()
            if outcome.claim is not None:
                counts = self._account(ledger, outcome.claim)
            else:
                error = outcome.error or ConnectionLostError("database connection lost")
                counts = self._fail_owners(sent.owners, classify_on(error, self.scope.using))
            self.observer.batch_done(counts)

    def _session(self) -> psycopg.Connection[Any] | None:
        """The session a claim is about to run on, watched on two connections (`_lost`)."""
        return raw_connection(self.scope.using) if self._two_connections else None

    def _lost(self, session: psycopg.Connection[Any] | None) -> bool:
        """Was the connection lost? On two connections, also when Django reconnected behind the
        claim (`session_lost`), as a lost lane's is."""
        using = self.scope.using
        return not connection_alive(using) if session is None else session_lost(using, session)

    def _remind_batch(self, ledger: Ledger, owners: list[store.DueOwner]) -> BatchCounts:
        session = self._session()
        try:
            outcome = ledger.claim(owners)
        except DatabaseErrors:
            using = self.scope.using
            if self._lost(session):
                lost = ConnectionLostError("database connection lost")
                self._fail_owners(owners, classify_on(lost, using))
                raise lost from None
            log_event(logger, logging.WARNING, "batch failed, retrying owner by owner",
                      run_id=self.result.run_id, owners=len(owners), exc_info=True)
            return self._retry_owner_by_owner(ledger, owners)
        return self._account(ledger, outcome)

    def _retry_owner_by_owner(self, ledger: Ledger, owners: list[store.DueOwner]) -> BatchCounts:
        """A failed batch's owners, each in its own transaction on this thread's connection."""
        using = self.scope.using
        counts = BatchCounts()
        for owner in owners:
            session = self._session()
            try:
                counts += self._account(ledger, ledger.claim([owner]))
            except DatabaseErrors as exc:
                counts += self._fail_owners([owner], classify_on(exc, using))
                if self._lost(session):
                    raise ConnectionLostError("database connection lost") from None
        return counts

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
