"""`--loop`: one cycle per tick, never overlapping, a missed tick at once, and a database
outage survived with exponential backoff instead of a crash."""

import logging
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from django.db import connections

from core.db import DatabaseErrors, backoff_delay
from core.logs import log_event
from reminders import schedule, store
from reminders.config import ReminderSettings
from reminders.models import ReminderRun
from reminders.result import CycleResult

logger = logging.getLogger("reminders.loop")

BACKOFF_START = timedelta(seconds=1)
BACKOFF_CAP = timedelta(minutes=5)


def run_loop(
    settings: ReminderSettings,
    run_one: Callable[[], CycleResult],
    *,
    stop: threading.Event,
    using: str = "default",
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    rng: random.Random | None = None,
) -> None:
    """Run cycles on the schedule until `stop` is set."""
    rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
    failures = 0
    log_event(logger, logging.INFO, "loop started", run_at_utc=settings.run_at_utc.isoformat(),
              polling_interval_s=settings.polling_interval.total_seconds())
    while not stop.is_set():
        try:
            last = store.last_successful_run_start(using)
            current = now()
            if schedule.tick_missed(last, current, settings.run_at_utc, settings.polling_interval):
                result = run_one()
                if result.status == ReminderRun.Status.FAILED:
                    raise ConnectionError(result.error or "cycle failed")
                failures = 0
                continue
            failures = 0
            wake = schedule.next_tick(current, settings.run_at_utc, settings.polling_interval)
            connections[using].close()  # hold no idle connection for a day
            log_event(logger, logging.INFO, "sleeping until next tick", next_tick=wake)
            stop.wait(max(0.0, (wake - now()).total_seconds()))
        except (*DatabaseErrors, ConnectionError) as exc:
            failures += 1
            delay = backoff_delay(failures, BACKOFF_START, BACKOFF_CAP, rng)
            log_event(logger, logging.ERROR, "database unavailable, retrying",
                      error=f"{type(exc).__name__}: {exc}".strip()[:500],
                      attempt=failures, retry_in_s=round(delay, 1))
            connections[using].close()
            stop.wait(delay)
    log_event(logger, logging.INFO, "loop stopped")
