"""When the loop runs (docs/design.md §3.9): ticks at the UTC time of day `run_at`, every
`interval`, and a missed tick runs at once. Pure functions of instants."""

from datetime import UTC, datetime, time, timedelta


def previous_tick(now: datetime, run_at: time, interval: timedelta) -> datetime:
    """The latest tick at or before `now` of the series run_at (today, UTC) + k * interval."""
    anchor = datetime.combine(now.astimezone(UTC).date(), run_at, tzinfo=UTC)
    steps = (now - anchor) // interval  # floor division: negative before today's anchor
    return anchor + steps * interval


def next_tick(now: datetime, run_at: time, interval: timedelta) -> datetime:
    """The first tick strictly after `now`."""
    return previous_tick(now, run_at, interval) + interval


def tick_missed(last_run_start: datetime | None, now: datetime, run_at: time,
                interval: timedelta) -> bool:
    """True when no cycle has started since the latest tick (after downtime, or first start)."""
    return last_run_start is None or last_run_start < previous_tick(now, run_at, interval)
