"""Settings from the environment, validated before any database work: one mechanism for the
Django settings, the worker's and the relay's.

`Environment` is django-environ's reader; `fields()` reads a table of variables, each with the
parser that validates it. Every problem raises `ConfigError`, whose message names the variable
and what is wrong; manage.py and the commands turn it into one line and exit code 2.
"""

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import time, timedelta
from typing import Any, Self, TypeVar

import environ
from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")
Parser = Callable[[str, str], T]

# ASCII digits only: `\d` would also take Arabic-Indic or fullwidth digits for numbers.
_WHOLE = re.compile(r"-?[0-9]+")
_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# Upper bounds: past them a value is a typo, and dates or timedeltas would overflow.
MAX_COUNT = 100_000
MAX_DURATION = timedelta(days=366)


class ConfigError(ImproperlyConfigured, ValueError):
    """A setting is missing or malformed; the message names it."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.name = name


class Settings:
    """Base of the frozen settings dataclasses."""

    __slots__ = ()

    def with_overrides(self, **changes: object) -> Self:
        """A copy with overrides applied (None means keep)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})  # type: ignore[type-var]


class Environment(environ.Env):  # type: ignore[misc]
    """django-environ's reader over `environ` (default: the process environment), plus
    validated reads that raise ConfigError naming the variable. Every value is taken as written:
    django-environ's interpolation (a value `$NAME` read as the variable NAME) is off."""

    def __init__(self, environ_: Mapping[str, str] | None = None) -> None:
        super().__init__()
        if environ_ is not None:
            self.ENVIRON = environ_

    def get_value(self, var: str, cast: Any = None, default: Any = environ.Env.NOTSET,
                  parse_default: bool = False) -> Any:
        """django-environ's `get_value` (under `str`, `list`, ...) without its interpolation,
        which 0.14 has no switch for: a secret key that starts with `$` was read as another
        variable's value, or an error about a variable nobody set."""
        raw = self.raw(var)
        if raw is None and default is self.NOTSET:
            raise ConfigError(var, "not set")
        value = default if raw is None else raw
        # django-environ's smart cast: an unset cast is the default's type.
        if cast is None and default is not None and not isinstance(default, environ.NoValue):
            cast = type(default)
        value = None if default is None and value == "" else value
        if value != default or (parse_default and value is not None):
            value = self.parse_value(value, cast)
        return value

    def raw(self, name: str) -> str | None:
        """The variable's text as set, or None when it is unset."""
        # Exactly what was set: validation must see an empty value, never expand a `$NAME`.
        value: str | None = self.ENVIRON.get(name)
        return value

    def parsed(self, name: str, parse: Parser[T], default: T) -> T:
        """`parse(name, text)` of the variable, or `default` when it is unset."""
        raw = self.raw(name)
        return default if raw is None else parse(name, raw)

    def fields(self, table: Mapping[str, tuple[str, Parser[Any]]]) -> dict[str, Any]:
        """{field: parsed value} for the variables of `table` (variable -> (field, parser))
        that are set."""
        values: dict[str, Any] = {}
        for name, (field_name, parse) in table.items():
            raw = self.raw(name)
            if raw is not None:
                values[field_name] = parse(name, raw)
        return values


def is_whole_number(text: str) -> bool:
    """An optional minus and ASCII digits, nothing else."""
    return _WHOLE.fullmatch(text) is not None


def parse_positive_int(name: str, raw: str, *, allow_zero: bool = False,
                       maximum: int | None = MAX_COUNT) -> int:
    """A whole number > 0 (or >= 0 with `allow_zero`), at most `maximum` (None: no bound)."""
    text = raw.strip()
    if not is_whole_number(text):
        raise ConfigError(name, f"expected a whole number, got {raw!r}")
    value = int(text)
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(name, f"must be {bound}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(name, f"must be <= {maximum}, got {value}")
    return value


def parse_non_negative_int(name: str, raw: str) -> int:
    """A whole number >= 0, unbounded (milliseconds and seconds for the database)."""
    return parse_positive_int(name, raw, allow_zero=True, maximum=None)


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


def parse_duration_or_zero(name: str, raw: str) -> timedelta:
    """A duration that may be zero (`0`, `0ms`, `0s`), for the producer's linger."""
    if raw.strip() in {"0", "0ms", "0s"}:
        return timedelta(0)
    return parse_duration(name, raw)


def parse_time_of_day(name: str, raw: str) -> time:
    """`03:00` (or `03:00:00`), a UTC time of day."""
    match = re.fullmatch(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?", raw.strip())
    if not match:
        raise ConfigError(name, f"expected a UTC time of day like 03:00, got {raw!r}")
    hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
    if hour > 23 or minute > 59 or second > 59:
        raise ConfigError(name, f"{raw!r} is not a valid time of day")
    return time(hour, minute, second)


def choice_parser(*choices: str, upper: bool = False) -> Parser[str]:
    """A parser that takes one of `choices` (compared in upper case with `upper`)."""
    listed = f"{', '.join(choices[:-1])} or {choices[-1]}"

    def parse(name: str, raw: str) -> str:
        value = raw.upper() if upper else raw
        if value not in choices:
            raise ConfigError(name, f"expected {listed}, got {raw!r}")
        return value

    return parse


_FLAGS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}


def parse_flag(name: str, raw: str) -> bool:
    """on/off, true/false, yes/no or 1/0; anything else names the variable."""
    value = _FLAGS.get(raw.strip().lower())
    if value is None:
        raise ConfigError(name, f"expected on or off (true/false, yes/no, 1/0), got {raw.strip().lower()!r}")
    return value


def is_local_host(host: str) -> bool:
    """A Unix socket (no host, or a directory) or a loopback address: nothing crosses a network."""
    host = host.strip()
    if not host or host.startswith(("/", "%2F", "%2f", "@")):
        return True
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
