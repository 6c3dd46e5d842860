"""Helpers shared by the management commands: settings, --as-of, durations, progress."""

import os
import sys
from datetime import UTC, date, datetime
from typing import TextIO

from django.core.management.base import CommandError

from core.commands import EXIT_FAILED, EXIT_USAGE
from core.config import ConfigError
from reminders.config import ReminderSettings, load_settings

EXIT_OWNERS_FAILED = EXIT_FAILED


def settings_from_env() -> ReminderSettings:
    """REMINDER_* from the process environment, or a one-line CommandError with exit code 2."""
    try:
        return load_settings(os.environ)
    except ConfigError as exc:
        raise CommandError(f"bad configuration: {exc}", returncode=EXIT_USAGE) from None


def parse_as_of(raw: str) -> datetime:
    """An ISO date (UTC midnight) or instant (a naive one is taken as UTC), as an aware UTC instant."""
    text = raw.strip()
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), datetime.min.time(), tzinfo=UTC)
        instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CommandError(
            f"--as-of: expected an ISO date (2026-11-29) or instant (2026-11-29T03:00:00Z), "
            f"got {raw!r}",
            returncode=EXIT_USAGE,
        ) from None
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=UTC)
    return instant.astimezone(UTC)


class ProgressLine:
    """A self-overwriting progress line on a terminal; silent elsewhere (logs say it all)."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.enabled = stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        if self.enabled:
            share = f"{100 * done / total:5.1f}%" if total else "  -  "
            self.stream.write(f"\r  documents {done:>10,} / {total:,}  {share}")
            self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.stream.write("\n")
