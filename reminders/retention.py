"""What the worker deletes, in bounded chunks of their own transactions (docs/design.md §3.6):
markers whose document has left the scan window (dated by the cycle's as-of), and old runs
from the run history (aged on the database's clock)."""

import logging
import threading
from collections.abc import Callable
from datetime import date, timedelta

from core.db import delete_in_chunks
from core.logs import log_event
from reminders import store
from reminders.config import ReminderSettings

logger = logging.getLogger("reminders.retention")

PRUNE_CHUNK = 5_000
RUN_HISTORY_CHUNK = 1_000
# prune_reminders deletes more than this share of the ledger only with --yes. A marker lives from
# its document's expiry minus the largest threshold to its expiry plus the retention (120 days at
# the defaults), and every cycle prunes, so a prune finds about a day of expiries: under 1% of the
# ledger. A tenth is 12 days' worth, more than any catch-up; a shortened retention, a wrong
# REMINDER_RETENTION_DAYS or a year typed wrong deletes more (docs/commands.md).
CONFIRM_PERCENT = 10


def prune_expired_markers(
    using: str,
    cutoff: date,
    *,
    stop: threading.Event | None = None,
    out_of_time: Callable[[], bool] = lambda: False,
    chunk: int = PRUNE_CHUNK,
    progress: Callable[[int], object] | None = None,
) -> int:
    """Delete markers expiring before `cutoff` in bounded chunks, one transaction each
    (`progress` is told the total so far after each)."""
    total = delete_in_chunks(
        using, lambda size: store.prune_expired_markers(using, cutoff, size),
        chunk=chunk, stop=stop, out_of_time=out_of_time, progress=progress,
    )
    log_event(logger, logging.INFO, "markers pruned", cutoff=cutoff, pruned=total)
    return total


def reasons_to_confirm(census: store.PruneCensus) -> list[str]:
    """Why the prune `census` counts needs the operator's --yes: markers of documents not expired
    yet on the database's clock, or more than CONFIRM_PERCENT of the ledger (empty: it needs none)."""
    reasons = []
    if census.expired * 100 > census.markers * CONFIRM_PERCENT:
        reasons.append(f"{census.expired} of the ledger's {census.markers} markers "
                       f"({census.expired * 100 // census.markers}%, more than {CONFIRM_PERCENT}%)")
    if census.unexpired:
        reasons.append(f"{census.unexpired} marker(s) of documents not expired yet (expiring on "
                       f"or after {census.today}, today on the database's clock)")
    return reasons


def run_history_age(settings: ReminderSettings) -> timedelta:
    """Runs that started longer ago than this are pruned (REMINDER_RUN_HISTORY_DAYS)."""
    return timedelta(days=settings.run_history_days)


def prune_run_history(using: str, older_than: timedelta, *, chunk: int = RUN_HISTORY_CHUNK) -> int:
    """Delete runs that started over `older_than` ago, in bounded chunks, one transaction each.

    Aged on the database's clock, which stamped `started_at` (`now() - older_than`): a worker
    whose clock runs ahead of the database's does not prune the runs it has just recorded."""
    total = delete_in_chunks(
        using, lambda size: store.prune_run_history(using, older_than, size), chunk=chunk
    )
    log_event(logger, logging.INFO, "run history pruned", older_than=older_than, pruned=total)
    return total
