"""The worker's settings, parsed from the environment and validated before any database work.

Every problem raises `ConfigError`, whose message names the variable and what is
wrong; commands turn it into one line on stderr and exit code 2.
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import time, timedelta

DEFAULT_THRESHOLDS = (30, 7, 1, 0)

# ASCII digits only: `\d` would also take Arabic-Indic or fullwidth digits for numbers.
_WHOLE = re.compile(r"-?[0-9]+")
_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# Upper bounds: past them a value is a typo, and dates or timedeltas would overflow.
MAX_DAYS = 3_650
MAX_BATCH_SIZE = 100_000
MAX_DURATION = timedelta(days=366)
# Liveness: a successful cycle within one polling interval and this much more (26 h at 24 h).
LIVENESS_SLACK = timedelta(hours=2)


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names it."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.name = name


@dataclass(frozen=True, slots=True)
class ReminderSettings:
    """What one cycle and the loop need (DESIGN 3, "Inputs" and "Schedule")."""

    thresholds: tuple[int, ...] = DEFAULT_THRESHOLDS
    batch_size: int = 500
    polling_interval: timedelta = timedelta(hours=24)
    run_at_utc: time = time(3, 0)
    max_run_duration: timedelta = timedelta(minutes=10)
    # the prune's own time after a cycle: a timed-out cycle still prunes, for this long
    prune_budget: timedelta = timedelta(minutes=1)
    retention_days: int = 90
    run_history_days: int = 90

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

    def with_overrides(self, **changes: object) -> "ReminderSettings":
        """A copy with command-line overrides applied (None means keep)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})  # type: ignore[arg-type]


def parse_thresholds(name: str, raw: str) -> tuple[int, ...]:
    """`30,7,1,0` -> (30, 7, 1, 0): non-empty, integers >= 0, distinct, sorted descending."""
    parts = [p.strip() for p in raw.split(",")]
    if raw.strip() == "" or any(p == "" for p in parts):
        raise ConfigError(name, f"expected comma-separated whole numbers like 30,7,1,0, got {raw!r}")
    values: list[int] = []
    for part in parts:
        if not _WHOLE.fullmatch(part):
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


def parse_positive_int(name: str, raw: str, *, allow_zero: bool = False,
                       maximum: int = MAX_BATCH_SIZE) -> int:
    """A whole number > 0 (or >= 0 with `allow_zero`), at most `maximum`."""
    text = raw.strip()
    if not _WHOLE.fullmatch(text):
        raise ConfigError(name, f"expected a whole number, got {raw!r}")
    value = int(text)
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(name, f"must be {bound}, got {value}")
    if value > maximum:
        raise ConfigError(name, f"must be <= {maximum}, got {value}")
    return value


def parse_duration(name: str, raw: str) -> timedelta:
    """`24h`, `10m`, `90s`, `1h30m`, `500ms`, or bare seconds; must be > 0."""
    text = raw.strip().lower()
    if re.fullmatch(r"[0-9]+", text):
        total_ms = int(text) * 1_000
    elif text and _DURATION_PART.sub("", text) == "":
        total_ms = sum(int(n) * _UNIT_MS[unit] for n, unit in _DURATION_PART.findall(text))
    else:
        raise ConfigError(
            name, f"expected a duration like 24h, 10m, 90s or 1h30m, got {raw!r}"
        )
    if total_ms <= 0:
        raise ConfigError(name, f"must be longer than zero, got {raw!r}")
    if total_ms > MAX_DURATION // timedelta(milliseconds=1):
        raise ConfigError(name, f"must be at most {MAX_DURATION.days} days, got {raw!r}")
    return timedelta(milliseconds=total_ms)


def parse_time_of_day(name: str, raw: str) -> time:
    """`03:00` (or `03:00:00`), a UTC time of day."""
    match = re.fullmatch(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?", raw.strip())
    if not match:
        raise ConfigError(name, f"expected a UTC time of day like 03:00, got {raw!r}")
    hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
    if hour > 23 or minute > 59 or second > 59:
        raise ConfigError(name, f"{raw!r} is not a valid time of day")
    return time(hour, minute, second)


def _retention_days(name: str, raw: str) -> int:
    return parse_positive_int(name, raw, allow_zero=True, maximum=MAX_DAYS)


def _history_days(name: str, raw: str) -> int:
    return parse_positive_int(name, raw, maximum=MAX_DAYS)


# variable -> (settings field, parser): every REMINDER_* the worker reads.
_VARIABLES: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "REMINDER_THRESHOLDS_DAYS": ("thresholds", parse_thresholds),
    "REMINDER_BATCH_SIZE": ("batch_size", parse_positive_int),
    "REMINDER_POLLING_INTERVAL": ("polling_interval", parse_duration),
    "REMINDER_RUN_AT_UTC": ("run_at_utc", parse_time_of_day),
    "REMINDER_MAX_RUN_DURATION": ("max_run_duration", parse_duration),
    "REMINDER_PRUNE_BUDGET": ("prune_budget", parse_duration),
    "REMINDER_RETENTION_DAYS": ("retention_days", _retention_days),
    "REMINDER_RUN_HISTORY_DAYS": ("run_history_days", _history_days),
}


def load_settings(environ: Mapping[str, str]) -> ReminderSettings:
    """Read REMINDER_* from `environ`, defaults for what is unset; raise ConfigError on bad input."""
    values = {
        field_name: parse(name, environ[name])
        for name, (field_name, parse) in _VARIABLES.items()
        if name in environ
    }
    return ReminderSettings().with_overrides(**values)
