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
