"""The relay's Kafka producer configuration: the security settings, the extra librdkafka
properties (which may not touch what the guarantees rest on, GUARDED_PROPERTIES), and an
outbox row's headers as a Kafka record takes them. The errors are outbox.kafka_errors', the
redaction outbox.redaction's, librdkafka's log outbox.kafka_log's."""

import json
import re
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from core.config import ConfigError
from outbox.config import PROPERTIES_VAR, KafkaSecurity, RelaySettings
from outbox.kafka_log import LibrdkafkaLog
from outbox.redaction import redact, secrets

# The librdkafka property each security variable sets.
SECURITY_VARIABLES = {
    "security.protocol": "KAFKA_SECURITY_PROTOCOL",
    "sasl.mechanism": "KAFKA_SASL_MECHANISM",
    "sasl.mechanisms": "KAFKA_SASL_MECHANISM",
    "sasl.username": "KAFKA_SASL_USERNAME",
    "sasl.password": "KAFKA_SASL_PASSWORD",
    "ssl.ca.location": "KAFKA_SSL_CA_LOCATION",
    "ssl.certificate.location": "KAFKA_SSL_CERTIFICATE_LOCATION",
    "ssl.key.location": "KAFKA_SSL_KEY_LOCATION",
    "ssl.key.password": "KAFKA_SSL_KEY_PASSWORD",
    "ssl.endpoint.identification.algorithm": "KAFKA_SSL_ENDPOINT_IDENTIFICATION",
}
_DELIVERY_TIMEOUT = "set OUTBOX_DELIVERY_TIMEOUT instead"
# The Java client's partitioner (murmur2 of the key): a key lands on the partition Kafka
# Connect, Debezium or Kafka Streams would choose (docs/outbox-relay.md, "The partitioner").
PARTITIONER = "murmur2_random"
# What KAFKA_PRODUCER_CONFIG may not set, and why: the guarantees, and what a variable owns.
GUARDED_PROPERTIES = {
    "enable.idempotence": "order per key without duplicates from retries rests on it (always true)",
    "acks": "at-least-once rests on it (always all)",
    "request.required.acks": "at-least-once rests on it (always all)",
    "message.timeout.ms": _DELIVERY_TIMEOUT,
    "delivery.timeout.ms": _DELIVERY_TIMEOUT,
    "socket.timeout.ms": f"{_DELIVERY_TIMEOUT}: no request waits on a broker longer than a "
                         f"message may",
    "transactional.id": "the relay does not use transactions",
    "delivery.report.only.error": "the relay's delivery accounting rests on it (always true)",
    "bootstrap.servers": "set KAFKA_BOOTSTRAP_SERVERS instead",
    "metadata.broker.list": "set KAFKA_BOOTSTRAP_SERVERS instead",
    "linger.ms": "set OUTBOX_LINGER instead",
    "queue.buffering.max.ms": "set OUTBOX_LINGER instead",
    "client.id": "the relay names its instances itself",
    "statistics.interval.ms": "set OUTBOX_STATISTICS_INTERVAL instead",
    "partitioner": f"order per key, and a key's partition being the one a Java producer would "
                   f"choose, rest on it (always {PARTITIONER})",
    **{prop: f"set {var} instead" for prop, var in SECURITY_VARIABLES.items()},
}
# Every TLS and SASL property besides (ssl.*, sasl.*, enable.ssl.certificate.verification, ...):
# how the relay proves the broker is the broker, and itself, is the KAFKA_SSL_* and KAFKA_SASL_*
# variables' alone, and the broker's certificate is always verified.
GUARDED_PREFIXES = ("ssl.", "ssl_", "sasl.", "sasl_", "enable.ssl.", "enable.sasl.")
_SECURITY_GUARD = ("TLS and SASL are set by KAFKA_SECURITY_PROTOCOL, KAFKA_SSL_* and KAFKA_SASL_* "
                   "only, and the broker's certificate is always verified")
def security_config(security: KafkaSecurity) -> dict[str, Any]:
    """librdkafka's security properties for the settings; a client of any kind needs them."""
    config: dict[str, Any] = {"security.protocol": security.protocol}
    if security.uses_sasl:
        assert security.sasl_password is not None  # noqa: S101 - load_security requires it
        config.update({"sasl.mechanism": security.sasl_mechanism,
                       "sasl.username": security.sasl_username,
                       "sasl.password": security.sasl_password.value})
    if security.uses_tls:
        config["ssl.endpoint.identification.algorithm"] = (
            "https" if security.ssl_endpoint_identification else "none")
        for prop, value in (("ssl.ca.location", security.ssl_ca_location),
                            ("ssl.certificate.location", security.ssl_certificate_location),
                            ("ssl.key.location", security.ssl_key_location),
                            ("ssl.key.password", security.ssl_key_password
                             and security.ssl_key_password.value)):
            if value:
                config[prop] = value
    return config


def client_config(settings: RelaySettings) -> dict[str, Any]:
    """Where Kafka is and how to get in: what a consumer (read_outbox_topic) needs too."""
    return {"bootstrap.servers": settings.bootstrap_servers, **security_config(settings.security)}


def admin_config(settings: RelaySettings, client_id: str) -> dict[str, Any]:
    """An admin client's (outbox.topic reads the topics' metadata and configuration with it):
    connected as the producer is (KAFKA_PRODUCER_CONFIG's properties too), logging as it does."""
    return {**extra_properties(settings), **client_config(settings), "client.id": client_id,
            "logger": LibrdkafkaLog(secrets(settings))}


def extra_properties(settings: RelaySettings) -> dict[str, Any]:
    """KAFKA_PRODUCER_CONFIG, refused (ConfigError) if it touches a guarded property."""
    for name, _value in settings.extra_properties:
        key = name.strip().lower()
        if key in GUARDED_PROPERTIES:
            raise ConfigError(PROPERTIES_VAR, f"may not set {name!r}: {GUARDED_PROPERTIES[key]}")
        if key.startswith(GUARDED_PREFIXES):
            raise ConfigError(PROPERTIES_VAR, f"may not set {name!r}: {_SECURITY_GUARD}")
        if key.endswith("_cb") or key in {"logger", "on_delivery"}:
            raise ConfigError(PROPERTIES_VAR, f"may not set {name!r}: a callback, not a property")
    return dict(settings.extra_properties)


def producer_config(settings: RelaySettings, client_id: str) -> dict[str, Any]:
    """An idempotent producer (acks=all) whose deliveries end within the delivery timeout, with
    the security settings and the extra properties (which cannot override the guarded ones)."""
    return {
        **extra_properties(settings),
        **client_config(settings),
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": PARTITIONER,
        "linger.ms": int(settings.linger.total_seconds() * 1000),
        "message.timeout.ms": int(settings.delivery_timeout.total_seconds() * 1000),
        # No request waits on a broker longer than a message may (librdkafka's default is 60 s):
        # a broker that stopped answering is disconnected then, and a metadata or idempotence-id
        # request that went to it, holding back that connection's requests, is asked elsewhere.
        "socket.timeout.ms": min(300_000, int(settings.delivery_timeout.total_seconds() * 1000)),
        "queue.buffering.max.messages": max(100_000, 2 * settings.batch_size),
        # Reports for errors only: a batch is acknowledged as a whole (outbox.producer).
        "delivery.report.only.error": True,
        # Notice a broker that is back within a couple of seconds (librdkafka's default is 10 s).
        "reconnect.backoff.max.ms": 2_000,
        "statistics.interval.ms": int(settings.statistics_interval.total_seconds() * 1000),
        "logger": LibrdkafkaLog(secrets(settings)),
    }


class _Silent:
    def log(self, *_args: Any) -> None:
        pass


def check_producer_config(settings: RelaySettings) -> None:
    """Build the producer once, offline (no bootstrap, nothing sent), so that librdkafka checks
    every property, file and key password now: a ConfigError naming the variable, secrets
    scrubbed. Done before any database or Kafka work."""
    config = {**producer_config(settings, "config-check"), "bootstrap.servers": "",
              "logger": _Silent()}
    try:
        Producer(config).flush(0)
    except KafkaException as exc:
        text = exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else str(exc)
        variable = next((var for prop, var in SECURITY_VARIABLES.items()
                         if re.search(rf"\b{re.escape(prop)}\b", text)), PROPERTIES_VAR)
        hint = "; check the key and KAFKA_SSL_KEY_PASSWORD" if "ssl.key.location" in text else ""
        raise ConfigError(variable,
                          f"librdkafka refused it: {redact(text, settings)}{hint}") from None


def new_producer(settings: RelaySettings, client_id: str, on_error: Any = None,
                 on_statistics: Any = None) -> Producer:
    config = producer_config(settings, client_id)
    if on_error is not None:
        config["error_cb"] = on_error
    if on_statistics is not None:
        config["stats_cb"] = on_statistics
    return Producer(config)


def new_patient_producer(settings: RelaySettings, client_id: str, on_error: Any) -> Producer:
    """The producer of rows whose earlier attempt may already be on the topic (outbox.patient):
    the relay's producer, but without a message time-out (librdkafka retries each message under
    its first sequence number until a broker answers, so the broker keeps one copy of it) and
    with a report for every message (few go this way); no statistics (the relay's producer's)."""
    return Producer({**producer_config(settings, f"{client_id}-patient"),
                     "message.timeout.ms": 0, "delivery.report.only.error": False,
                     "statistics.interval.ms": 0, "error_cb": on_error})


def record_headers(headers: Any) -> dict[str, str]:
    """A row's headers (its JSON object) as the producer takes them: every value text (UTF-8 on
    the wire); a value stored as another JSON type is sent as its JSON text."""
    if not isinstance(headers, dict):
        raise TypeError(f"an outbox row's headers must be a JSON object, not {type(headers).__name__}")
    return {name: value if isinstance(value, str) else json.dumps(value)
            for name, value in headers.items()}
