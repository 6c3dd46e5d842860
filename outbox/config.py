"""The relay's settings (KAFKA_BOOTSTRAP_SERVERS, OUTBOX_*), read and validated through
core.config before any database or Kafka work: a bad value raises ConfigError naming it."""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from core.config import (
    MAX_COUNT,
    ConfigError,
    Environment,
    Parser,
    Settings,
    parse_duration,
    parse_duration_or_zero,
    parse_positive_int,
)

BOOTSTRAP_VAR = "KAFKA_BOOTSTRAP_SERVERS"


@dataclass(frozen=True, slots=True)
class RelaySettings(Settings):
    """What the relay needs; docs/outbox-relay.md explains each value."""

    bootstrap_servers: str = ""
    batch_size: int = 500
    poll_interval: timedelta = timedelta(seconds=2)
    retention: timedelta = timedelta(days=7)
    max_attempts: int = 5
    delivery_timeout: timedelta = timedelta(seconds=30)
    claim_ttl: timedelta = timedelta(minutes=2)
    shutdown_grace: timedelta = timedelta(seconds=10)
    backoff_initial: timedelta = timedelta(seconds=1)
    backoff_max: timedelta = timedelta(minutes=1)
    linger: timedelta = timedelta(milliseconds=5)


def parse_bootstrap(name: str, raw: str) -> str:
    """`host:port[,host:port...]`, each part with a host and a numeric port."""
    parts = [p.strip() for p in raw.split(",")]
    if raw.strip() == "" or any(p == "" for p in parts):
        raise ConfigError(name, f"expected host:port[,host:port...], got {raw!r}")
    for part in parts:
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(name, f"{part!r} is not host:port")
    return ",".join(parts)


# variable -> (settings field, parser): every OUTBOX_* the relay reads.
VARIABLES: dict[str, tuple[str, Parser[Any]]] = {
    BOOTSTRAP_VAR: ("bootstrap_servers", parse_bootstrap),
    "OUTBOX_BATCH_SIZE": ("batch_size", parse_positive_int),
    "OUTBOX_POLL_INTERVAL": ("poll_interval", parse_duration),
    "OUTBOX_RETENTION": ("retention", parse_duration),
    "OUTBOX_MAX_ATTEMPTS": ("max_attempts", parse_positive_int),
    "OUTBOX_DELIVERY_TIMEOUT": ("delivery_timeout", parse_duration),
    "OUTBOX_CLAIM_TTL": ("claim_ttl", parse_duration),
    "OUTBOX_SHUTDOWN_GRACE": ("shutdown_grace", parse_duration),
    "OUTBOX_BACKOFF_INITIAL": ("backoff_initial", parse_duration),
    "OUTBOX_BACKOFF_MAX": ("backoff_max", parse_duration),
    "OUTBOX_LINGER": ("linger", parse_duration_or_zero),
}


def load_relay_settings(environ: Mapping[str, str], *, need_kafka: bool = True) -> RelaySettings:
    """Read KAFKA_BOOTSTRAP_SERVERS and OUTBOX_* from `environ`; defaults for what is unset."""
    env = Environment(environ)
    if need_kafka and env.raw(BOOTSTRAP_VAR) is None:
        raise ConfigError(BOOTSTRAP_VAR, "not set; expected host:port[,host:port...]")
    settings = RelaySettings().with_overrides(**env.fields(VARIABLES))
    validate(settings)
    return settings


def validate(settings: RelaySettings) -> None:
    """Cross-field rules: a claim must outlive a delivery, backoff must be a range."""
    if settings.claim_ttl <= settings.delivery_timeout:
        raise ConfigError(
            "OUTBOX_CLAIM_TTL",
            f"must be longer than OUTBOX_DELIVERY_TIMEOUT ({settings.delivery_timeout}), "
            f"got {settings.claim_ttl}",
        )
    if settings.backoff_max < settings.backoff_initial:
        raise ConfigError(
            "OUTBOX_BACKOFF_MAX",
            f"must be at least OUTBOX_BACKOFF_INITIAL ({settings.backoff_initial}), "
            f"got {settings.backoff_max}",
        )
    if settings.batch_size > MAX_COUNT:
        raise ConfigError("OUTBOX_BATCH_SIZE", f"must be <= {MAX_COUNT}, got {settings.batch_size}")
