"""The reminder rules of docs/design.md §3.2, as pure functions: no I/O, no clock, no database.

They are the reference. For speed the cycle runs them in SQL, inside the claim statement
(`claim_batch` in sql/queries.sql, and `due` in `due_owners`); tests/integration/test_claim_rules.py
holds the SQL to these functions on every case. --dry-run runs them here.
"""

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta


@dataclass(frozen=True, slots=True)
class Window:
    """The scan window of UTC dates, both ends inclusive, and its instants for sargable SQL."""

    first_day: date
    last_day: date

    @property
    def start(self) -> datetime:
        """UTC midnight opening the first day (inclusive bound on expires_at)."""
        return datetime.combine(self.first_day, time(0), tzinfo=UTC)

    @property
    def end(self) -> datetime:
        """UTC midnight after the last day (exclusive bound on expires_at)."""
        return datetime.combine(self.last_day + timedelta(days=1), time(0), tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one due document: mark `markers` (of which `rearmed` replace a marker
    of an earlier expiry date); notify `notify` unless it is None."""

    markers: tuple[int, ...]
    notify: int | None
    days_left: int
    rearmed: tuple[int, ...] = ()


def utc_date(instant: datetime) -> date:
    """The UTC calendar date of an aware instant (days are counted on UTC dates)."""
    if instant.tzinfo is None:
        raise ValueError("naive datetime: every instant must be timezone-aware")
    return instant.astimezone(UTC).date()


def days_left(expires_on: date, as_of_date: date) -> int:
    """Days from the cycle's UTC date to the document's UTC expiry date (negative once past)."""
    return (expires_on - as_of_date).days


def scan_window(as_of_date: date, thresholds: Collection[int], retention_days: int) -> Window:
    """[as_of - retention, as_of + max threshold]: reminders live inside it, markers outlive it."""
    return Window(
        first_day=as_of_date - timedelta(days=retention_days),
        last_day=as_of_date + timedelta(days=max(thresholds)),
    )


def prune_cutoff(as_of_date: date, retention_days: int) -> date:
    """Markers whose expiry date is before this day are pruned (the document has left the scan)."""
    return as_of_date - timedelta(days=retention_days)


def crossed_thresholds(left: int, thresholds: Iterable[int]) -> frozenset[int]:
    """The thresholds a document with `left` days to go has reached (`left <= t`)."""
    return frozenset(t for t in thresholds if left <= t)


def remaining_thresholds(
    left: int, thresholds: Iterable[int], marked: Collection[int]
) -> frozenset[int]:
    """Crossed thresholds that have no marker yet."""
    return crossed_thresholds(left, thresholds) - frozenset(marked)


def current_markers(markers: Mapping[int, date], expires_on: date) -> frozenset[int]:
    """The thresholds whose marker was written for the document's current expiry date: a
    marker of an earlier date (renewed or corrected) counts for nothing (docs/design.md §3.2)."""
    return frozenset(t for t, marked_for in markers.items() if marked_for == expires_on)


def decide(
    expires_on: date, as_of_date: date, thresholds: Iterable[int], markers: Mapping[int, date]
) -> Decision | None:
    """`markers`: threshold -> the expiry date its marker was written for. None when nothing
    remains (already marked for this date); else mark every remaining threshold and notify
    only t* = min(remaining), unless a more urgent threshold than t* is marked (stale)."""
    left = days_left(expires_on, as_of_date)
    marked = current_markers(markers, expires_on)
    remaining = remaining_thresholds(left, thresholds, marked)
    if not remaining:
        return None
    t_star = min(remaining)
    stale = any(m < t_star for m in marked)
    return Decision(markers=tuple(sorted(remaining)), notify=None if stale else t_star,
                    days_left=left, rearmed=tuple(sorted(remaining & markers.keys())))
