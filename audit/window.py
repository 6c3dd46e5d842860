"""The audit's window: `since` before `as_of`, starting no earlier than the outbox's retention
allows (older events may be pruned, and their markers would look unmatched). A window with
nothing left in it is refused, never audited as clean."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta


class WindowError(ValueError):
    """The window cannot be audited: why, and what to pass instead (one line)."""


@dataclass(frozen=True, slots=True)
class Window:
    start: datetime
    end: datetime
    notes: list[str] = field(default_factory=list)


def audit_window(as_of: datetime, since: timedelta, *, now: datetime,
                 outbox_retention: timedelta) -> Window:
    """The window to audit, on the database's clock `now`; WindowError when it is empty,
    inverted or wholly older than OUTBOX_RETENTION."""
    if since <= timedelta(0):
        raise WindowError(f"nothing to audit: the window before --as-of is empty (--since "
                          f"{since}); pass a --since longer than zero (7d by default)")
    floor = now - outbox_retention
    if as_of <= floor:
        raise WindowError(
            f"nothing to audit: --as-of {as_of.isoformat()} is at or before "
            f"{floor.isoformat()}, OUTBOX_RETENTION ({outbox_retention}) back from the "
            "database's clock, so the window's events may all have been pruned; pass an "
            f"--as-of after {floor.isoformat()}")
    wanted = as_of - since
    if wanted < floor:
        return Window(floor, as_of, [
            f"window starts at {floor.isoformat()}, not {wanted.isoformat()}: events older "
            f"than OUTBOX_RETENTION ({outbox_retention}) may have been pruned"])
    return Window(wanted, as_of)
