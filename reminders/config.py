"""The worker's settings (REMINDER_*), read and validated through core.config before any
database work: a bad value raises ConfigError naming the variable."""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import time, timedelta
from typing import Any

from core.config import (
    ConfigError,
    Environment,
    Parser,
    Settings,
    is_whole_number,
    parse_duration,
    parse_positive_int,
    parse_time_of_day,
)

DEFAULT_THRESHOLDS = (30, 7, 1, 0)
# Past this many days a threshold or a retention is a typo, and dates would overflow.
MAX_DAYS = 3_650
# Liveness: a successful cycle within one polling interval and this much more (26 h at 24 h).
LIVENESS_SLACK = timedelta(hours=2)


@dataclass(frozen=True, slots=True)
class ReminderSettings(Settings):
    """What one cycle and the loop need (docs/design.md §3 and §3.9)."""

    thresholds: tuple[int, ...] = DEFAULT_THRESHOLDS
    batch_size: int = 500
    polling_interval: timedelta = timedelta(hours=24)
    run_at_utc: time = time(3, 0)
    max_run_duration: timedelta = timedelta(minutes=10)
    # the prune's own time after a cycle: a timed-out cycle still prunes, for this long
    prune_budget: timedelta = timedelta(minutes=1)
    retention_days: int = 90
    run_history_days: int = 90
    # The loop's wait after consecutive failures: doubling from the first, up to the cap.
    backoff_initial: timedelta = timedelta(seconds=1)
    backoff_max: timedelta = timedelta(minutes=5)
    # Connections a cycle claims on: 2 keeps a batch in flight on a second connection while
    # the cycle's own claims the next (docs/design.md §3.8); 1 claims on the cycle's only.
    claim_connections: int = 2

    @property
    def max_silence(self) -> timedelta:
        """Longest time without a successful cycle before the worker counts as dead: the
        polling interval plus LIVENESS_SLACK (26 h at the default 24 h)."""
        return self.polling_interval + LIVENESS_SLACK

    @property
    def longest_cycle(self) -> timedelta:
        """A cycle's time budget and then its prune's: how long one can take, give or take
        the statement in flight."""
        return self.max_run_duration + self.prune_budget


def parse_thresholds(name: str, raw: str) -> tuple[int, ...]:
    """`30,7,1,0` -> (30, 7, 1, 0): non-empty, integers >= 0, distinct, sorted descending."""
    parts = [p.strip() for p in raw.split(",")]
    if raw.strip() == "" or any(p == "" for p in parts):
        raise ConfigError(name, f"expected comma-separated whole numbers like 30,7,1,0, got {raw!r}")
    values: list[int] = []
    for part in parts:
        if not is_whole_number(part):
            raise ConfigError(name, f"{part!r} is not a whole number")
        values.append(int(part))
    if any(v < 0 for v in values):
        raise ConfigError(name, f"thresholds must be >= 0, got {raw!r}")
    if any(v > MAX_DAYS for v in values):
        raise ConfigError(name, f"thresholds must be <= {MAX_DAYS} days, got {raw!r}")
    if len(set(values)) != len(values):
        raise ConfigError(name, f"thresholds must be distinct, got {raw!r}")
    if values != sorted(values, reverse=True):
        raise ConfigError(name, f"thresholds must be sorted descending, got {raw!r}")
    return tuple(values)


CLAIM_CONNECTIONS = (1, 2)


def parse_claim_connections(name: str, raw: str) -> int:
    """`1` or `2`: the connections a cycle claims on."""
    text = raw.strip()
    if not is_whole_number(text) or int(text) not in CLAIM_CONNECTIONS:
        raise ConfigError(name, f"expected 1 or 2 (the connections a cycle claims on), got {raw!r}")
    return int(text)


def _retention_days(name: str, raw: str) -> int:
    return parse_positive_int(name, raw, allow_zero=True, maximum=MAX_DAYS)


def _history_days(name: str, raw: str) -> int:
    return parse_positive_int(name, raw, maximum=MAX_DAYS)


# variable -> (settings field, parser): every REMINDER_* the worker reads.
VARIABLES: dict[str, tuple[str, Parser[Any]]] = {
    "REMINDER_THRESHOLDS_DAYS": ("thresholds", parse_thresholds),
    "REMINDER_BATCH_SIZE": ("batch_size", parse_positive_int),
    "REMINDER_POLLING_INTERVAL": ("polling_interval", parse_duration),
    "REMINDER_RUN_AT_UTC": ("run_at_utc", parse_time_of_day),
    "REMINDER_MAX_RUN_DURATION": ("max_run_duration", parse_duration),
    "REMINDER_PRUNE_BUDGET": ("prune_budget", parse_duration),
    "REMINDER_RETENTION_DAYS": ("retention_days", _retention_days),
    "REMINDER_RUN_HISTORY_DAYS": ("run_history_days", _history_days),
    "REMINDER_BACKOFF_INITIAL": ("backoff_initial", parse_duration),
    "REMINDER_BACKOFF_MAX": ("backoff_max", parse_duration),
    "REMINDER_CLAIM_CONNECTIONS": ("claim_connections", parse_claim_connections),
}


def load_settings(environ: Mapping[str, str]) -> ReminderSettings:
    """Read REMINDER_* from `environ`, defaults for what is unset; raise ConfigError on bad input."""
    settings = ReminderSettings().with_overrides(**Environment(environ).fields(VARIABLES))
    if settings.backoff_max < settings.backoff_initial:
        raise ConfigError("REMINDER_BACKOFF_MAX",
                          f"must be at least REMINDER_BACKOFF_INITIAL ({settings.backoff_initial}), "
                          f"got {settings.backoff_max}")
    return settings
