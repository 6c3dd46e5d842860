"""The reminders' census (docs/design.md §5): documents in the scan window now, and how many
of them are due (their current threshold has no marker). The backlog gauge and the admin
overview both show it."""

from datetime import datetime
from typing import NamedTuple

from reminders import rules, store
from reminders.config import ReminderSettings


class Census(NamedTuple):
    window_documents: int
    due_documents: int


def census_now(settings: ReminderSettings, now: datetime, using: str = "default") -> Census:
    """The census at `now` (its UTC day), for `settings`' thresholds and retention."""
    today = rules.utc_date(now)
    window = rules.scan_window(today, settings.thresholds, settings.retention_days)
    return Census(*store.window_census(using, window, settings.thresholds, today))
