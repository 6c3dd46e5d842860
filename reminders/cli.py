"""Helpers shared by the worker's management commands: --as-of (the progress bar is
core.progress's)."""

from datetime import UTC, date, datetime

from core.commands import usage_error


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
