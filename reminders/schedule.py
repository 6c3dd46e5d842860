"""When the loop runs (docs/design.md §3.9): ticks at the UTC time of day `run_at`, every
`interval`, and a missed tick runs at once. Pure functions of instants.

One clock: the ticks are computed on the worker's clock, and each loop run records the tick
it ran for; "missed" compares that recorded tick with the current one, never a database
timestamp with the worker's clock (a skew of seconds would start cycles back to back)."""

from datetime import UTC, datetime, time, timedelta


def previous_tick(now: datetime, run_at: time, interval: timedelta) -> datetime:
    """The latest tick at or before `now` of the series run_at (today, UTC) + k * interval."""
    anchor = datetime.combine(now.astimezone(UTC).date(), run_at, tzinfo=UTC)
    steps = (now - anchor) // interval  # floor division: negative before today's anchor
    return anchor + steps * interval


def next_tick(now: datetime, run_at: time, interval: timedelta) -> datetime:
    """The first tick strictly after `now`."""
    return previous_tick(now, run_at, interval) + interval


def tick_missed(last_tick: datetime | None, current_tick: datetime) -> bool:
    """True when no loop run has done its work for the current tick (after downtime, or at
    the first start). `last_tick`: the latest tick recorded by a loop run, on the same clock."""
    return last_tick is None or last_tick < current_tick
