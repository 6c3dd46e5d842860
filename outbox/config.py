"""The relay's settings, parsed from the environment and validated before any database or
Kafka work, the way `reminders.config` does it: every problem raises `ConfigError` naming the
variable, and the commands turn it into one line on stderr and exit code 2."""

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta

from reminders.config import ConfigError, parse_duration, parse_positive_int

BOOTSTRAP_VAR = "KAFKA_BOOTSTRAP_SERVERS"


@dataclass(frozen=True, slots=True)
class RelaySettings:
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

    def with_overrides(self, **changes: object) -> "RelaySettings":
        """A copy with overrides applied (None means keep)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})  # type: ignore[arg-type]


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


def _millis(name: str, raw: str) -> timedelta:
    """A duration that may be zero (`0` or `0ms`), for the producer's linger."""
    if raw.strip() in {"0", "0ms", "0s"}:
        return timedelta(0)
    return parse_duration(name, raw)


def load_relay_settings(environ: Mapping[str, str], *, need_kafka: bool = True) -> RelaySettings:
    """Read KAFKA_BOOTSTRAP_SERVERS and OUTBOX_* from `environ`; defaults for what is unset."""
    defaults = RelaySettings()
    bootstrap = ""
    raw_bootstrap = environ.get(BOOTSTRAP_VAR)
    if raw_bootstrap is not None:
        bootstrap = parse_bootstrap(BOOTSTRAP_VAR, raw_bootstrap)
    elif need_kafka:
        raise ConfigError(BOOTSTRAP_VAR, "not set; expected host:port[,host:port...]")

    def duration(name: str, default: timedelta) -> timedelta:
        raw = environ.get(name)
        return default if raw is None else parse_duration(name, raw)

    def whole(name: str, default: int) -> int:
        raw = environ.get(name)
        return default if raw is None else parse_positive_int(name, raw)

    linger = defaults.linger
    if (raw := environ.get("OUTBOX_LINGER")) is not None:
        linger = _millis("OUTBOX_LINGER", raw)
    settings = RelaySettings(
        bootstrap_servers=bootstrap,
        batch_size=whole("OUTBOX_BATCH_SIZE", defaults.batch_size),
        poll_interval=duration("OUTBOX_POLL_INTERVAL", defaults.poll_interval),
        retention=duration("OUTBOX_RETENTION", defaults.retention),
        max_attempts=whole("OUTBOX_MAX_ATTEMPTS", defaults.max_attempts),
        delivery_timeout=duration("OUTBOX_DELIVERY_TIMEOUT", defaults.delivery_timeout),
        claim_ttl=duration("OUTBOX_CLAIM_TTL", defaults.claim_ttl),
        shutdown_grace=duration("OUTBOX_SHUTDOWN_GRACE", defaults.shutdown_grace),
        backoff_initial=duration("OUTBOX_BACKOFF_INITIAL", defaults.backoff_initial),
        backoff_max=duration("OUTBOX_BACKOFF_MAX", defaults.backoff_max),
        linger=linger,
    )
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
    if settings.batch_size > 100_000:
        raise ConfigError("OUTBOX_BATCH_SIZE", f"must be <= 100000, got {settings.batch_size}")
