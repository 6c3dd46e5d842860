"""`--loop`: one cycle per tick, never overlapping, a missed tick at once, and a database
outage survived with exponential backoff instead of a crash. Ticks are on the worker's clock
and each loop run records its tick (reminders.schedule)."""

import logging
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from django.db import connections

from core.db import DatabaseErrors, backoff_delay
from core.failures import DatabaseFailure, classify_on, retry_event
from core.logs import log_event
from reminders import schedule, store
from reminders.config import ReminderSettings
from reminders.models import SUCCESSFUL_STATUSES, ReminderRun
from reminders.result import CycleResult

logger = logging.getLogger("reminders.loop")

BACKOFF_START = timedelta(seconds=1)
BACKOFF_CAP = timedelta(minutes=5)


class CycleFailedError(Exception):
    """A cycle of the loop failed; `failure` says why (core.failures)."""

    def __init__(self, failure: DatabaseFailure) -> None:
        super().__init__(failure.reason)
        self.failure = failure


def run_loop(
    settings: ReminderSettings,
    run_one: Callable[..., CycleResult],
    *,
    stop: threading.Event,
    using: str = "default",
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    rng: random.Random | None = None,
) -> None:
    """Run cycles on the schedule until `stop` is set. `run_one(tick=...)` runs one cycle
    recorded as the loop's run for that tick."""
    rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
    failures = 0
    done: datetime | None = None  # the tick this process last ran to the end
    log_event(logger, logging.INFO, "loop started", run_at_utc=settings.run_at_utc.isoformat(),
              polling_interval_s=settings.polling_interval.total_seconds())
    while not stop.is_set():
        try:
            current = now()
            tick = schedule.previous_tick(current, settings.run_at_utc, settings.polling_interval)
            # Ticks recorded by any instance's loop runs, and this process's own (in case it
            # could not record its last one): never the same tick twice in a row.
            recorded = [t for t in (store.last_loop_tick(using), done) if t is not None]
            if schedule.tick_missed(max(recorded, default=None), tick):
                result = run_one(tick=tick)
                if result.status == ReminderRun.Status.FAILED:
                    raise CycleFailedError(result.failure or classify_on(
                        ConnectionError(result.error or "cycle failed"), using))
                if result.status in SUCCESSFUL_STATUSES:
                    done = tick
                failures = 0
                continue
            failures = 0
            wake = schedule.next_tick(current, settings.run_at_utc, settings.polling_interval)
            connections[using].close()  # hold no idle connection for a day
            log_event(logger, logging.INFO, "sleeping until next tick", next_tick=wake)
            stop.wait(max(0.0, (wake - now()).total_seconds()))
        except (*DatabaseErrors, ConnectionError, CycleFailedError) as exc:
            failure = exc.failure if isinstance(exc, CycleFailedError) else classify_on(exc, using)
            failures += 1
            delay = backoff_delay(failures, BACKOFF_START, BACKOFF_CAP, rng)
            # The event says which: unreachable, a missing table or grant, or another error.
            log_event(logger, logging.ERROR, retry_event(failure), **failure.fields(),
                      attempt=failures, retry_in_s=round(delay, 1))
            connections[using].close()
            stop.wait(delay)
    log_event(logger, logging.INFO, "loop stopped")
