"""`--loop` on one clock (docs/design.md §3.9): the worker's clock, with the tick each loop
run was for recorded in the run history. The worker's clock is a fake one here that moves
only when the loop sleeps, so days of ticks pass in no time and every sleep is seen; the
database keeps its own clock, seconds or hours away from the worker's."""

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from reminders import schedule
from reminders.config import ReminderSettings
from reminders.cycle import run_cycle
from reminders.loop import run_loop
from reminders.models import ReminderRun
from reminders.result import CycleResult
from tests.support.db_roles import as_worker

DAY = timedelta(days=1)
CAP = 20  # cycles: a loop gone back to back is stopped here


class Clock:
    """The worker's clock: it moves only when the loop sleeps on its stop event."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


class SleepOnClock(threading.Event):
    """The loop's stop event: a wait moves the fake clock on instead of sleeping, and the
    event sets itself once the clock reaches `until`."""

    def __init__(self, clock: Clock, until: datetime) -> None:
        super().__init__()
        self.clock, self.until = clock, until

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.now += timedelta(seconds=timeout or 0)
        if self.clock.now >= self.until:
            self.set()
        return self.is_set()


class LoopRun:
    """run_loop on the fake clock, with real cycles as the worker role; `cycles` lists
    (worker's time, tick) of each cycle the loop started."""

    def __init__(self, clock: Clock, settings: ReminderSettings) -> None:
        self.clock, self.settings = clock, settings
        self.cycles: list[tuple[datetime, datetime | None]] = []

    def until(self, end: datetime) -> list[tuple[datetime, datetime | None]]:
        stop = SleepOnClock(self.clock, end)
        started = len(self.cycles)

        def run_one(**options: Any) -> CycleResult:
            self.cycles.append((self.clock.now, options.get("tick")))
            if len(self.cycles) - started >= CAP:
                stop.set()
            with as_worker():
                return run_cycle(self.settings, **options)

        run_loop(self.settings, run_one, stop=stop, now=self.clock)
        return self.cycles[started:]


def database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("select now()")
        row = cursor.fetchone()
    assert row is not None
    return row[0].astimezone(UTC)  # type: ignore[no-any-return]


def expected_cycles(start: datetime, end: datetime,
                    settings: ReminderSettings) -> list[tuple[datetime, datetime]]:
    """At the first start the current tick at once; then each tick, on the tick, once."""
    at, every = settings.run_at_utc, settings.polling_interval
    cycles = [(start, schedule.previous_tick(start, at, every))]
    tick = schedule.next_tick(start, at, every)
    while tick < end:
        cycles.append((tick, tick))
        tick += every
    return cycles


@pytest.mark.parametrize("skew", [
    timedelta(seconds=3), timedelta(hours=5), timedelta(seconds=-3), timedelta(hours=-5)],
    ids=["3s-ahead", "5h-ahead", "3s-behind", "5h-behind"])
def test_one_cycle_per_tick_whatever_the_skew_from_the_database_clock(
    transactional_db: None, skew: timedelta,
) -> None:
    db_now = database_now()
    # The tick falls between the database's clock and the worker's: where comparing the two
    # clocks either starts cycles back to back (worker ahead) or skips the tick (behind).
    tick = db_now + skew / 2
    settings = ReminderSettings(run_at_utc=tick.time())
    start = db_now + skew
    loop = LoopRun(Clock(start), settings)

    cycles = loop.until(start + 3 * DAY)

    assert cycles == expected_cycles(start, start + 3 * DAY, settings)
    runs = ReminderRun.objects.order_by("started_at")
    assert [(r.trigger, r.tick, r.status) for r in runs] == [
        ("loop", t, "succeeded") for _at, t in cycles]


def test_a_backfill_does_not_count_as_the_loop_run_of_today(transactional_db: None) -> None:
    db_now = database_now()
    settings = ReminderSettings(run_at_utc=(db_now - timedelta(hours=1)).time())
    today = schedule.previous_tick(db_now, settings.run_at_utc, settings.polling_interval)
    # Yesterday the loop ran its tick (the fake clock stops it at its first sleep).
    yesterday = LoopRun(Clock(db_now - DAY), settings).until(db_now - DAY + timedelta(seconds=1))
    assert [at for at, _tick in yesterday] == [db_now - DAY]
    # Today, after today's tick, an operator backfills ten days ago by hand ...
    with as_worker():
        backfill = run_cycle(settings, as_of=db_now - 10 * DAY)

    # ... and the loop, restarted, still runs today's tick at once.
    restarted = LoopRun(Clock(db_now), settings).until(db_now + timedelta(seconds=1))

    assert [at for at, _tick in restarted] == [db_now]
    assert (yesterday[0][1], restarted[0][1]) == (today - DAY, today)
    assert ReminderRun.objects.get(run_id=backfill.run_id).trigger == "manual"


def test_a_manual_run_records_no_tick(transactional_db: None) -> None:
    tick = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
    with as_worker():
        manual = run_cycle(ReminderSettings(), as_of=tick)
        looped = run_cycle(ReminderSettings(), as_of=tick, tick=tick)

    assert (ReminderRun.objects.get(run_id=manual.run_id).trigger,
            ReminderRun.objects.get(run_id=manual.run_id).tick) == ("manual", None)
    assert (ReminderRun.objects.get(run_id=looped.run_id).trigger,
            ReminderRun.objects.get(run_id=looped.run_id).tick) == ("loop", tick)
