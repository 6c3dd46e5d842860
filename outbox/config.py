"""The relay's settings (KAFKA_BOOTSTRAP_SERVERS, OUTBOX_*), read and validated through
core.config before any database or Kafka work: a bad value raises ConfigError naming it."""

import json
import os
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from core.config import (
    ConfigError,
    Environment,
    Parser,
    Settings,
    choice_parser,
    is_local_host,
    parse_duration,
    parse_duration_or_zero,
    parse_flag,
    parse_positive_int,
)

BOOTSTRAP_VAR = "KAFKA_BOOTSTRAP_SERVERS"
PROPERTIES_VAR = "KAFKA_PRODUCER_CONFIG"
ALLOW_UNDURABLE_VAR = "OUTBOX_ALLOW_UNDURABLE_TOPIC"
TOPICS_VAR = "OUTBOX_TOPICS"
# The contract's topic (reminders.events.TOPIC; the outbox does not import the worker's app, and
# tests/unit/test_relay_config.py checks that the two agree).
CONTRACT_TOPIC = "pin.profile.document-expiry-reminders.v1"
# A name Kafka takes for a topic: its legal characters, at most 249 of them, not "." or "..".
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# PLAIN over SASL_PLAINTEXT sends the password as it is: refused unless this names PLAIN, and
# then only for brokers on loopback addresses (docs/operations.md, "Security").
PLAIN_CLEARTEXT_ALLOW_VAR = "KAFKA_SASL_PLAINTEXT_ALLOW"

# The relay's clock (monotonic seconds) and its log (level, event, fields: the relay's log_event
# with its relay id), as every part of the relay is given them.
Clock = Callable[[], float]
Emit = Callable[[int, str, dict[str, Any]], None]

# The stream's smallest read, and its first (OUTBOX_BATCH_SIZE_MIN's default; a smaller
# OUTBOX_BATCH_SIZE is the only size: outbox.lanes.ReadSize).
MIN_READ_ROWS = 100

# A librdkafka property value, as KAFKA_PRODUCER_CONFIG may give it.
Scalar = str | int | float | bool


@dataclass(frozen=True, slots=True)
class Secret:
    """A password: never shown by repr() or str(), so no log line or exception carries it."""

    value: str = field(repr=False)

    def __str__(self) -> str:
        return "***"


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """How the relay authenticates to Kafka and verifies it (KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_*,
    KAFKA_SSL_*); docs/outbox-relay.md, "A secured Kafka"."""

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: Secret | None = None
    ssl_endpoint_identification: bool = True

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.protocol.endswith("SSL")


@dataclass(frozen=True, slots=True)
class RelaySettings(Settings):
    """What the relay needs; docs/outbox-relay.md explains each value."""

    bootstrap_servers: str = ""
    # The most rows a batch reads; the stream's reads start at `batch_size_min` (or at
    # `batch_size`, if it is smaller) and grow while a backlog drains (outbox.lanes).
    batch_size: int = 5000
    batch_size_min: int = MIN_READ_ROWS
    poll_interval: timedelta = timedelta(seconds=2)
    retention: timedelta = timedelta(days=7)
    max_attempts: int = 5
    delivery_timeout: timedelta = timedelta(seconds=30)
    shutdown_grace: timedelta = timedelta(seconds=10)
    backoff_initial: timedelta = timedelta(seconds=1)
    backoff_max: timedelta = timedelta(minutes=1)
    linger: timedelta = timedelta(milliseconds=5)
    # A Kafka outage is logged once, then summarised once per this interval (outbox.kafka).
    outage_log_interval: timedelta = timedelta(seconds=60)
    # librdkafka's statistics (round-trip times, queue) every this often, for the metrics.
    statistics_interval: timedelta = timedelta(seconds=15)
    security: KafkaSecurity = KafkaSecurity()
    # Further librdkafka properties from KAFKA_PRODUCER_CONFIG; outbox.kafka refuses the guarded.
    extra_properties: tuple[tuple[str, Scalar], ...] = ()
    # Publish to a topic that may lose what it acknowledged (outbox.topic_watch): a single-broker
    # development setup only.
    allow_undurable_topic: bool = False
    # The only topics the relay publishes to (OUTBOX_TOPICS): a row naming another is parked,
    # never sent (docs/operations.md, "Security").
    topics: frozenset[str] = frozenset({CONTRACT_TOPIC})



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


def parse_topics(name: str, raw: str) -> frozenset[str]:
    """`topic[,topic...]`: each a name Kafka takes for a topic; duplicates are one."""
    parts = [p.strip() for p in raw.split(",")]
    if raw.strip() == "" or any(p == "" for p in parts):
        raise ConfigError(name, f"expected topic[,topic...], got {raw!r}")
    for part in parts:
        if not _TOPIC_NAME.fullmatch(part) or part in {".", ".."}:
            raise ConfigError(name, f"{part!r} is not a Kafka topic name (letters, digits, "
                                    "'.', '_' and '-', at most 249)")
    return frozenset(parts)


def off_allowlist_error(topic: str, allowed: frozenset[str]) -> str:
    """Why the relay does not send a row naming `topic`, a topic not in `allowed`: the error
    the parked row keeps (`last_error`)."""
    return (f"topic {topic!r} is not on {TOPICS_VAR} ({', '.join(sorted(allowed))}): "
            "never sent, parked")


# variable -> (settings field, parser): every OUTBOX_* the relay reads.
VARIABLES: dict[str, tuple[str, Parser[Any]]] = {
    BOOTSTRAP_VAR: ("bootstrap_servers", parse_bootstrap),
    "OUTBOX_BATCH_SIZE": ("batch_size", parse_positive_int),
    "OUTBOX_BATCH_SIZE_MIN": ("batch_size_min", parse_positive_int),
    "OUTBOX_POLL_INTERVAL": ("poll_interval", parse_duration),
    "OUTBOX_RETENTION": ("retention", parse_duration),
    "OUTBOX_MAX_ATTEMPTS": ("max_attempts", parse_positive_int),
    "OUTBOX_DELIVERY_TIMEOUT": ("delivery_timeout", parse_duration),
    "OUTBOX_SHUTDOWN_GRACE": ("shutdown_grace", parse_duration),
    "OUTBOX_BACKOFF_INITIAL": ("backoff_initial", parse_duration),
    "OUTBOX_BACKOFF_MAX": ("backoff_max", parse_duration),
    "OUTBOX_LINGER": ("linger", parse_duration_or_zero),
    "OUTBOX_OUTAGE_LOG_INTERVAL": ("outage_log_interval", parse_duration),
    "OUTBOX_STATISTICS_INTERVAL": ("statistics_interval", parse_duration),
    ALLOW_UNDURABLE_VAR: ("allow_undurable_topic", parse_flag),
    TOPICS_VAR: ("topics", parse_topics),
}
# librdkafka takes statistics.interval.ms up to a day.
MAX_STATISTICS_INTERVAL = timedelta(days=1)


_protocol = choice_parser(*PROTOCOLS, upper=True)
_sasl_mechanism = choice_parser(*SASL_MECHANISMS, upper=True)
# Read by no code since the relay stopped leasing rows (docs/configuration.md).
DEPRECATED_VARIABLES = {"OUTBOX_CLAIM_TTL": "no row is leased any more; remove it"}


def _readable_file(name: str, raw: str) -> str:
    path = raw.strip()
    if not path or not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ConfigError(name, f"no readable file at {path!r}")
    return path


def load_security(environ: Mapping[str, str]) -> KafkaSecurity:
    """KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_* and KAFKA_SSL_*, each checked against the protocol:
    a SASL or TLS setting the protocol would ignore is refused, not silently dropped."""
    protocol = _protocol("KAFKA_SECURITY_PROTOCOL",
                         environ.get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").strip())
    sasl, tls = protocol.startswith("SASL_"), protocol.endswith("SSL")

    def get(name: str, *, needs: bool, required: bool = False) -> str | None:
        raw = environ.get(name)
        if raw is not None and not needs:
            wanted = "SASL_PLAINTEXT or SASL_SSL" if "SASL" in name else "SSL or SASL_SSL"
            raise ConfigError(name, f"set, but KAFKA_SECURITY_PROTOCOL is {protocol} "
                                    f"(it needs {wanted})")
        if (raw is None or raw == "") and required:
            raise ConfigError(name, f"required with KAFKA_SECURITY_PROTOCOL={protocol}")
        if raw is not None and raw.strip() == "":
            raise ConfigError(name, "empty")
        return raw

    mechanism = get("KAFKA_SASL_MECHANISM", needs=sasl, required=sasl)
    username = get("KAFKA_SASL_USERNAME", needs=sasl, required=sasl)
    password = get("KAFKA_SASL_PASSWORD", needs=sasl, required=sasl)  # never echoed
    ca, cert, key, key_password, identify = (
        get(f"KAFKA_SSL_{name}", needs=tls) for name in
        ("CA_LOCATION", "CERTIFICATE_LOCATION", "KEY_LOCATION", "KEY_PASSWORD",
         "ENDPOINT_IDENTIFICATION"))
    if (cert is None) != (key is None):
        missing = "KAFKA_SSL_KEY_LOCATION" if key is None else "KAFKA_SSL_CERTIFICATE_LOCATION"
        raise ConfigError(missing, "required with the other half of the client certificate")
    if key_password is not None and key is None:
        raise ConfigError("KAFKA_SSL_KEY_PASSWORD", "set, but KAFKA_SSL_KEY_LOCATION is not")
    if identify is not None and identify.strip().lower() not in {"https", "none"}:
        raise ConfigError("KAFKA_SSL_ENDPOINT_IDENTIFICATION",
                          f"expected https (verify the broker's host name) or none, got {identify!r}")
    sasl_mechanism = (_sasl_mechanism("KAFKA_SASL_MECHANISM", mechanism.strip())
                      if mechanism is not None else None)
    check_cleartext_password(protocol, sasl_mechanism, environ)
    return KafkaSecurity(
        protocol=protocol,
        sasl_mechanism=sasl_mechanism,
        sasl_username=username.strip() if username is not None else None,
        sasl_password=Secret(password) if password is not None else None,
        ssl_ca_location=_readable_file("KAFKA_SSL_CA_LOCATION", ca) if ca is not None else None,
        ssl_certificate_location=_readable_file("KAFKA_SSL_CERTIFICATE_LOCATION", cert)
        if cert is not None else None,
        ssl_key_location=_readable_file("KAFKA_SSL_KEY_LOCATION", key) if key is not None else None,
        ssl_key_password=Secret(key_password) if key_password is not None else None,
        ssl_endpoint_identification=identify is None or identify.strip().lower() == "https",
    )


def check_cleartext_password(protocol: str, mechanism: str | None,
                             environ: Mapping[str, str]) -> None:
    """PLAIN over SASL_PLAINTEXT is refused, unless KAFKA_SASL_PLAINTEXT_ALLOW=PLAIN and every
    broker in KAFKA_BOOTSTRAP_SERVERS is on a loopback address."""
    if protocol != "SASL_PLAINTEXT" or mechanism != "PLAIN":
        return
    allowed = environ.get(PLAIN_CLEARTEXT_ALLOW_VAR)
    if allowed is not None and allowed.strip().upper() != "PLAIN":
        raise ConfigError(PLAIN_CLEARTEXT_ALLOW_VAR, f"expected PLAIN, got {allowed.strip()!r}")
    if allowed is None:
        raise ConfigError("KAFKA_SASL_MECHANISM",
                          "PLAIN over SASL_PLAINTEXT sends the password as it is: use SASL_SSL or "
                          f"SCRAM, or set {PLAIN_CLEARTEXT_ALLOW_VAR}=PLAIN for a loopback broker")
    remote = [server for server in environ.get(BOOTSTRAP_VAR, "").split(",")
              if server.strip() and not is_local_host(server.strip().rpartition(":")[0])]
    if remote:
        raise ConfigError(PLAIN_CLEARTEXT_ALLOW_VAR,
                          f"allows PLAIN over SASL_PLAINTEXT to loopback brokers only, and "
                          f"{BOOTSTRAP_VAR} names {len(remote)} other(s)")


def parse_properties(name: str, raw: str) -> tuple[tuple[str, Scalar], ...]:
    """A JSON object of librdkafka properties with scalar values; its text is never echoed (it
    may hold a secret)."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(name, f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(parsed, dict):
        raise ConfigError(name, "expected a JSON object of librdkafka properties")
    for key, value in parsed.items():
        if not key.strip() or not isinstance(value, str | int | float | bool):
            raise ConfigError(name, f"property {key!r}: expected a string, number or boolean")
    return tuple(sorted(parsed.items()))


def load_relay_settings(environ: Mapping[str, str], *, need_kafka: bool = True,
                        batch_size: str | None = None) -> RelaySettings:
    """Read KAFKA_* and OUTBOX_* from `environ`; defaults for what is unset. `batch_size`
    (publish_outbox --batch-size) stands for OUTBOX_BATCH_SIZE, checked with the rest."""
    env = Environment(environ)
    for name, why in DEPRECATED_VARIABLES.items():
        if env.raw(name) is not None:
            # A DeprecationWarning, not a log line: an operator's output stays as it was.
            warnings.warn(f"{name} is deprecated and ignored: {why}", DeprecationWarning,
                          stacklevel=2)
    if need_kafka and env.raw(BOOTSTRAP_VAR) is None:
        raise ConfigError(BOOTSTRAP_VAR, "not set; expected host:port[,host:port...]")
    raw_properties = env.raw(PROPERTIES_VAR)
    fields = env.fields(VARIABLES)
    security = load_security(environ)
    extra_properties = (() if raw_properties is None
                        else parse_properties(PROPERTIES_VAR, raw_properties))
    if batch_size is not None:
        fields["batch_size"] = parse_positive_int("--batch-size", batch_size)
    settings = RelaySettings().with_overrides(**fields, security=security,
                                              extra_properties=extra_properties)
    validate(settings, batch_size_min_set="batch_size_min" in fields,
             batch_size_from="OUTBOX_BATCH_SIZE" if batch_size is None else "--batch-size")
    return settings


def validate(settings: RelaySettings, *, batch_size_min_set: bool = False,
             batch_size_from: str = "OUTBOX_BATCH_SIZE") -> None:
    """Cross-field rules: backoff must be a range, the statistics interval bounded, a smallest
    read set no larger than the largest (each batch size is bounded by its parser,
    parse_positive_int; the default smallest read yields to a smaller OUTBOX_BATCH_SIZE)."""
    if batch_size_min_set and settings.batch_size_min > settings.batch_size:
        raise ConfigError(
            "OUTBOX_BATCH_SIZE_MIN",
            f"must be at most {batch_size_from} ({settings.batch_size}), "
            f"got {settings.batch_size_min}",
        )
    if settings.backoff_max < settings.backoff_initial:
        raise ConfigError(
            "OUTBOX_BACKOFF_MAX",
            f"must be at least OUTBOX_BACKOFF_INITIAL ({settings.backoff_initial}), "
            f"got {settings.backoff_max}",
        )
    if settings.statistics_interval > MAX_STATISTICS_INTERVAL:
        raise ConfigError("OUTBOX_STATISTICS_INTERVAL",
                          f"must be at most 24h, got {settings.statistics_interval}")
