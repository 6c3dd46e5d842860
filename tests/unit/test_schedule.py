"""The loop's schedule: ticks at run_at every interval; a missed tick runs at once."""

from datetime import UTC, datetime, time, timedelta

from reminders import schedule

DAY = timedelta(hours=24)
AT_3 = time(3, 0)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[arg-type, misc]


def test_daily_ticks_at_three() -> None:
    assert schedule.previous_tick(utc(2026, 11, 29, 2, 59), AT_3, DAY) == utc(2026, 11, 28, 3)
    assert schedule.previous_tick(utc(2026, 11, 29, 3, 0), AT_3, DAY) == utc(2026, 11, 29, 3)
    assert schedule.next_tick(utc(2026, 11, 29, 3, 0), AT_3, DAY) == utc(2026, 11, 30, 3)
    assert schedule.next_tick(utc(2026, 11, 29, 1, 0), AT_3, DAY) == utc(2026, 11, 29, 3)


def test_hourly_ticks_are_anchored_on_run_at() -> None:
    hour = timedelta(hours=1)
    assert schedule.next_tick(utc(2026, 11, 29, 0, 10), time(3, 30), hour) == utc(2026, 11, 29, 0, 30)
    assert schedule.previous_tick(utc(2026, 11, 29, 17, 45), time(3, 30), hour) == utc(
        2026, 11, 29, 17, 30)


def test_a_missed_tick_runs_at_once() -> None:
    tick = schedule.previous_tick(utc(2026, 11, 29, 14, 0), AT_3, DAY)
    assert schedule.tick_missed(None, tick)  # never ran
    assert schedule.tick_missed(utc(2026, 11, 28, 3, 0), tick)  # down since yesterday
    assert not schedule.tick_missed(utc(2026, 11, 29, 3, 0), tick)
    assert not schedule.tick_missed(utc(2026, 11, 30, 3, 0), tick)  # another instance is ahead
