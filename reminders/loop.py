"""`--loop`: one cycle per tick, never overlapping, a missed tick at once, and a database
outage survived with exponential backoff (core.supervise) instead of a crash. Ticks are on the worker's clock
and each loop run records its tick (reminders.schedule)."""

import logging
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from django.db import connections

from core.db import DatabaseErrors
from core.failures import DatabaseFailure, classify_on, retry_event
from core.logs import log_event
from core.supervise import Backoff, Wait, supervise
from reminders import schedule, store
from reminders.config import ReminderSettings
from reminders.models import SUCCESSFUL_STATUSES
from reminders.result import CycleResult

logger = logging.getLogger("reminders.loop")



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
    wait: Wait | None = None,
) -> None:
    """Run cycles on the schedule until `stop` is set. `run_one(tick=...)` runs one cycle
    recorded as the loop's run for that tick. Failures back off (core.supervise) from
    REMINDER_BACKOFF_INITIAL up to REMINDER_BACKOFF_MAX."""
    wait = wait or stop.wait
    backoff = Backoff(settings.backoff_initial, settings.backoff_max, wait=wait, rng=rng)
    done: datetime | None = None  # the tick this process last ran to the end

    def step() -> None:
        nonlocal done
        current = now()
        tick = schedule.previous_tick(current, settings.run_at_utc, settings.polling_interval)
        # Ticks recorded by any instance's loop runs, and this process's own (in case it
        # could not record its last one): never the same tick twice in a row.
        recorded = [t for t in (store.last_loop_tick(using), done) if t is not None]
        if schedule.tick_missed(max(recorded, default=None), tick):
            result = run_one(tick=tick)
            if result.failure is not None:  # the cycle failed (CycleResult.fail)
                raise CycleFailedError(result.failure)
            if result.status in SUCCESSFUL_STATUSES:
                done = tick
            backoff.succeeded()
            return
        backoff.succeeded()
        wake = schedule.next_tick(current, settings.run_at_utc, settings.polling_interval)
        connections[using].close()  # hold no idle connection for a day
        log_event(logger, logging.INFO, "sleeping until next tick", next_tick=wake)
        wait(max(0.0, (wake - now()).total_seconds()))

    def failed(exc: BaseException, failures: int, delay: float) -> None:
        failure = exc.failure if isinstance(exc, CycleFailedError) else classify_on(exc, using)
        # The event says which: unreachable, a missing table or grant, or another error.
        log_event(logger, logging.ERROR, retry_event(failure), **failure.fields(),
                  attempt=failures, retry_in_s=round(delay, 1))
        connections[using].close()

    log_event(logger, logging.INFO, "loop started", run_at_utc=settings.run_at_utc.isoformat(),
              polling_interval_s=settings.polling_interval.total_seconds())
    supervise(step, stop=stop, backoff=backoff,
              retry_on=(*DatabaseErrors, ConnectionError, CycleFailedError), kind="cycle",
              said=failed)
    log_event(logger, logging.INFO, "loop stopped")
