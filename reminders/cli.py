"""Helpers shared by the worker's management commands: --as-of, and the refusal of a future
one (the progress bar is core.progress's)."""

from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

from core.commands import usage_error

# An as-of this little past the worker's clock is still now (an operator's clock a little ahead).
FUTURE_TOLERANCE = timedelta(minutes=5)


def parse_as_of(raw: str) -> datetime:
    """An ISO date (UTC midnight) or instant (a naive one is taken as UTC), as an aware UTC instant."""
    text = raw.strip()
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), datetime.min.time(), tzinfo=UTC)
        instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise usage_error(
            f"--as-of: expected an ISO date (2026-11-29) or instant (2026-11-29T03:00:00Z), "
            f"got {raw!r}"
        ) from None
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=UTC)
    return instant.astimezone(UTC)


def refuse_future_as_of(as_of: datetime | None, *, dry_run: bool,
                        now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
    """Refuse (exit 2) an as-of past the worker's clock, unless `dry_run`: a cycle would remind
    ahead of the day, a prune would delete the markers of documents still in the window (a typo
    in the year: every investor reminded again)."""
    if as_of is not None and as_of > now() + FUTURE_TOLERANCE and not dry_run:
        raise usage_error(f"--as-of {as_of.isoformat()} is in the future; "
                          "only --dry-run may look ahead")
