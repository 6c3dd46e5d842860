"""REMINDER_* parsing: defaults, good values, and a clear error naming each bad one."""

from datetime import time, timedelta

import pytest

from core.config import ConfigError, parse_duration
from reminders.config import ReminderSettings, load_settings


def test_defaults_when_nothing_is_set() -> None:
    assert load_settings({}) == ReminderSettings(
        thresholds=(30, 7, 1, 0), batch_size=500, polling_interval=timedelta(hours=24),
        run_at_utc=time(3, 0), max_run_duration=timedelta(minutes=10),
        prune_budget=timedelta(minutes=1), retention_days=90, claim_connections=2,
    )


def test_every_variable_is_read() -> None:
    settings = load_settings({
        "REMINDER_THRESHOLDS_DAYS": " 60, 14,3 ,0", "REMINDER_BATCH_SIZE": "1000",
        "REMINDER_POLLING_INTERVAL": "12h", "REMINDER_RUN_AT_UTC": "23:30",
        "REMINDER_MAX_RUN_DURATION": "1h30m", "REMINDER_RETENTION_DAYS": "0",
        "REMINDER_PRUNE_BUDGET": "30s", "REMINDER_CLAIM_CONNECTIONS": " 1 ",
    })
    assert settings == ReminderSettings(
        thresholds=(60, 14, 3, 0), batch_size=1000, polling_interval=timedelta(hours=12),
        run_at_utc=time(23, 30), max_run_duration=timedelta(minutes=90), retention_days=0,
        prune_budget=timedelta(seconds=30), claim_connections=1,
    )
    assert settings.longest_cycle == timedelta(minutes=90, seconds=30)


def test_liveness_limit_follows_the_polling_interval() -> None:
    assert ReminderSettings().max_silence == timedelta(hours=26)
    assert ReminderSettings(polling_interval=timedelta(hours=1)).max_silence == timedelta(hours=3)


@pytest.mark.parametrize(("text", "expected"), [
    ("24h", timedelta(hours=24)), ("10m", timedelta(minutes=10)), ("90", timedelta(seconds=90)),
    ("1h30m", timedelta(minutes=90)), ("500ms", timedelta(milliseconds=500)),
    ("1d", timedelta(days=1)),
])
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration("X", text) == expected


BAD = [
    ("REMINDER_THRESHOLDS_DAYS", "", "comma-separated"),
    ("REMINDER_THRESHOLDS_DAYS", "30,,7", "comma-separated"),
    ("REMINDER_THRESHOLDS_DAYS", "7,30,1,0", "sorted descending"),
    ("REMINDER_THRESHOLDS_DAYS", "30,7,7,0", "distinct"),
    ("REMINDER_THRESHOLDS_DAYS", "30,7,-1", ">= 0"),
    ("REMINDER_THRESHOLDS_DAYS", "30,seven", "not a whole number"),
    ("REMINDER_BATCH_SIZE", "0", "> 0"),
    ("REMINDER_BATCH_SIZE", "-5", "> 0"),
    ("REMINDER_BATCH_SIZE", "lots", "whole number"),
    ("REMINDER_POLLING_INTERVAL", "0h", "longer than zero"),
    ("REMINDER_POLLING_INTERVAL", "daily", "duration"),
    ("REMINDER_POLLING_INTERVAL", "-1h", "duration"),
    ("REMINDER_RUN_AT_UTC", "3am", "time of day"),
    ("REMINDER_RUN_AT_UTC", "24:00", "not a valid time"),
    ("REMINDER_MAX_RUN_DURATION", "10 minutes", "duration"),
    ("REMINDER_MAX_RUN_DURATION", "0", "longer than zero"),
    ("REMINDER_PRUNE_BUDGET", "0", "longer than zero"),
    ("REMINDER_RETENTION_DAYS", "-1", ">= 0"),
    ("REMINDER_RETENTION_DAYS", "90d", "whole number"),
    ("REMINDER_CLAIM_CONNECTIONS", "0", "expected 1 or 2"),
    ("REMINDER_CLAIM_CONNECTIONS", "3", "expected 1 or 2"),
    ("REMINDER_CLAIM_CONNECTIONS", "two", "expected 1 or 2"),
    ("REMINDER_CLAIM_CONNECTIONS", "", "expected 1 or 2"),
]


@pytest.mark.parametrize(("name", "value", "problem"), BAD)
def test_bad_value_names_the_variable_and_the_problem(name: str, value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({name: value})
    assert caught.value.name == name
    message = str(caught.value)
    assert message.startswith(f"{name}: ") and problem in message and "\n" not in message
