"""What a cycle does to the ledger, as one small protocol with two implementations: the
cycle's own (`Writes`: the run recorded, each batch claimed in its own transaction, expired
markers pruned) and the dry run's (`DryRun`: the same questions answered, nothing written).

The cycle (`reminders.cycle`) calls `start`, then `claim` per batch, `prune`, and `finish`;
which ledger it holds is the only place the dry run differs.
"""

import logging
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Protocol

from django.db import connections, transaction

from core.db import DatabaseErrors, connection_alive
from core.logs import log_event
from reminders import dry_run, retention, rules, store
from reminders.config import ReminderSettings
from reminders.models import SUCCESSFUL_STATUSES
from reminders.result import CycleResult

logger = logging.getLogger("reminders.cycle")  # what the ledger does is logged as the cycle's doing

ABANDONED_AFTER_MIN = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Scope:
    """What a cycle works on: the same for both ledgers."""

    settings: ReminderSettings
    using: str
    run_id: uuid.UUID
    as_of: datetime
    window: rules.Window
    max_documents_per_event: int
    tick: datetime | None = None  # the loop's tick the cycle runs for; None for a manual run

    @property
    def as_of_date(self) -> date:
        return rules.utc_date(self.as_of)


class Ledger(Protocol):
    """The ledger as a cycle uses it."""

    reminder_event: str  # the log line of each reminder a claim returns

    def start(self) -> None:
        """Before the first batch."""

    def claim(self, owners: list[store.DueOwner]) -> store.BatchClaim:
        """One batch of whole owners."""

    def prune(self, stop: threading.Event, out_of_time: Callable[[], bool]) -> int:
        """The expired markers: how many went (or would go)."""

    def finish(self, result: CycleResult) -> None:
        """After the cycle, whatever its status."""


class Writes:
    """The cycle's ledger: the run history, the markers and the outbox events."""

    reminder_event = "reminder queued"

    def __init__(self, scope: Scope, extra_headers: Mapping[str, str] | None = None) -> None:
        self.scope = scope
        self.extra_headers = dict(extra_headers) if extra_headers else None

    def start(self) -> None:
        scope = self.scope
        # A killed process never records its end: close such runs once no cycle could
        # still be going (twice the budget, and at least an hour).
        store.close_abandoned_runs(
            scope.using, max(2 * scope.settings.longest_cycle, ABANDONED_AFTER_MIN))
        store.start_run(scope.using, scope.run_id, scope.as_of, scope.settings.thresholds,
                        socket.gethostname(), tick=scope.tick)

    def claim(self, owners: list[store.DueOwner]) -> store.BatchClaim:
        scope = self.scope
        # An owner's most urgent documents only: the rest stay unmarked, due next cycle.
        cap = scope.max_documents_per_event
        document_ids = sorted(doc for owner in owners for doc in owner.document_ids[:cap])
        with transaction.atomic(using=scope.using, durable=True):
            # The rules run inside the claim statement (they mirror rules.decide, tested
            # alike), so only the due documents' ids travel to the database.
            return store.claim_batch(
                scope.using, document_ids, scope.window, scope.settings.thresholds,
                scope.as_of_date, run_id=scope.run_id, as_of=scope.as_of,
                extra_headers=self.extra_headers,
            )

    def prune(self, stop: threading.Event, out_of_time: Callable[[], bool]) -> int:
        cutoff = rules.prune_cutoff(self.scope.as_of_date, self.scope.settings.retention_days)
        return retention.prune_expired_markers(
            self.scope.using, cutoff, stop=stop, out_of_time=out_of_time)

    def finish(self, result: CycleResult) -> None:
        self._record_finish(result)
        if result.status in SUCCESSFUL_STATUSES:
            self._prune_run_history()

    def _record_finish(self, result: CycleResult) -> None:
        using = self.scope.using
        try:
            if not connection_alive(using):
                connections[using].close()
            store.finish_run(using, result.run_id, status=result.status,
                             counters=result.counters(), duration_ms=result.duration_ms,
                             error=result.error)
        except DatabaseErrors:
            log_event(logger, logging.WARNING, "could not record the end of the cycle",
                      run_id=result.run_id, status=result.status)

    def _prune_run_history(self) -> None:
        """The run history's own prune, after a cycle that did its work (a failure waits for
        the next cycle)."""
        try:
            retention.prune_run_history(
                self.scope.using, retention.run_history_age(self.scope.settings))
        except DatabaseErrors as exc:
            log_event(logger, logging.WARNING, "run history prune failed; retried next cycle",
                      error=type(exc).__name__)


class DryRun:
    """`--dry-run`: what the cycle would claim and prune, decided by `rules.decide` in Python
    (`reminders.dry_run`); no run is recorded and nothing is written."""

    reminder_event = "reminder due"

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def start(self) -> None:
        pass

    def claim(self, owners: list[store.DueOwner]) -> store.BatchClaim:
        scope = self.scope
        return dry_run.claim_batch(
            scope.using, [owner.owner_user_id for owner in owners], scope.window,
            scope.settings.thresholds, scope.as_of_date,
            max_documents_per_event=scope.max_documents_per_event)

    def prune(self, stop: threading.Event, out_of_time: Callable[[], bool]) -> int:
        cutoff = rules.prune_cutoff(self.scope.as_of_date, self.scope.settings.retention_days)
        return store.count_expired_markers(self.scope.using, cutoff)

    def finish(self, result: CycleResult) -> None:
        pass
