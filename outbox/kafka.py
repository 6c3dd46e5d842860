"""The Kafka side of the relay: the producer's configuration (security settings, and extra
librdkafka properties that may not touch what the guarantees rest on), an outbox row as a Kafka
record, and which errors mean "the broker is unavailable" (wait and retry, no attempt counted),
"this message cannot be delivered" (count an attempt, park it eventually), or "the broker
refused the relay" (wrong credentials or certificate: stop, exit 1)."""

import json
import logging
import re
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from core.config import ConfigError
from outbox.config import PROPERTIES_VAR, KafkaSecurity, RelaySettings
from outbox.store import ClaimedMessage

logger = logging.getLogger("outbox.kafka")

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
_DELIVERY_TIMEOUT = "set OUTBOX_DELIVERY_TIMEOUT instead: it must stay below OUTBOX_CLAIM_TTL"
# What KAFKA_PRODUCER_CONFIG may not set, and why: the guarantees, and what a variable owns.
GUARDED_PROPERTIES = {
    "enable.idempotence": "order per key without duplicates from retries rests on it (always true)",
    "acks": "at-least-once rests on it (always all)",
    "request.required.acks": "at-least-once rests on it (always all)",
    "message.timeout.ms": _DELIVERY_TIMEOUT,
    "delivery.timeout.ms": _DELIVERY_TIMEOUT,
    "transactional.id": "the relay does not use transactions",
    "bootstrap.servers": "set KAFKA_BOOTSTRAP_SERVERS instead",
    "metadata.broker.list": "set KAFKA_BOOTSTRAP_SERVERS instead",
    "linger.ms": "set OUTBOX_LINGER instead",
    "queue.buffering.max.ms": "set OUTBOX_LINGER instead",
    "client.id": "the relay names its instances itself",
    "statistics.interval.ms": "set OUTBOX_STATISTICS_INTERVAL instead",
    **{prop: f"set {var} instead" for prop, var in SECURITY_VARIABLES.items()},
}
# Property names whose values are secrets: never shown, even from KAFKA_PRODUCER_CONFIG.
_SECRET_NAME = re.compile(r"password|secret|token|\.pem$|credential")
# librdkafka's variable tail of an error: "(after 31ms in state AUTH_REQ, 2 identical ...)".
_ERROR_TAIL = re.compile(r"\s*\(after [0-9]+ms in state [A-Z_]+[^)]*\)")

# The broker (or the way to it) is unavailable: nothing is wrong with the message itself.
UNAVAILABLE_CODES = frozenset({
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError._TIMED_OUT_QUEUE,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError._QUEUE_FULL,
    KafkaError._PURGE_QUEUE,
    KafkaError._PURGE_INFLIGHT,
    KafkaError._DESTROY,
    KafkaError._FATAL,
    KafkaError._NODE_UPDATE,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.KAFKA_STORAGE_ERROR,
    # The idempotent producer's state, not the message: a restarted broker forgot the producer.
    KafkaError.UNKNOWN_PRODUCER_ID,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
    KafkaError.INVALID_PRODUCER_EPOCH,
})

# The message can never go out as it is: too large, no such topic, not authorised, invalid.
UNDELIVERABLE_CODES = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG,
    KafkaError._INVALID_ARG,
})


# The broker refused the relay itself: credentials, SASL mechanism, or the TLS handshake
# (certificate not trusted, host name mismatch). Waiting does not change that.
REFUSED_CODES = frozenset({
    KafkaError._AUTHENTICATION,
    KafkaError._SSL,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.UNSUPPORTED_SASL_MECHANISM,
    KafkaError.ILLEGAL_SASL_STATE,
})


# A TLS alert from the broker's side after the handshake (TLS 1.3 sends "certificate required"
# that way), or this side's own verification of the broker's certificate failing (a wrong CA,
# a host name it does not name), which librdkafka may report as a transport error before its
# _SSL one: either way the handshake was refused, and no retry changes that.
_TLS_REFUSAL = re.compile(r"SSL routines::(.*alert (certificate required|bad certificate|unknown ca"
                          r"|certificate unknown|certificate revoked|certificate expired"
                          r"|access denied|handshake failure)|certificate verify failed)")


class KafkaRefusedError(RuntimeError):
    """The broker refused the relay's credentials or TLS handshake; the message says which
    settings to check and carries no secret."""


def refused(error: KafkaError) -> bool:
    """True when `error` says the broker will not let this client in as configured."""
    if error.code() == KafkaError._TRANSPORT:
        return bool(_TLS_REFUSAL.search(error.str()))
    return error.code() in REFUSED_CODES


def broker_unavailable(error: KafkaError) -> bool:
    """True when `error` says nothing about the message, only that Kafka could not be reached."""
    code = error.code()
    if error.fatal():
        return True  # the producer failed (a new one takes over), not the message
    if code in UNDELIVERABLE_CODES:
        return False
    return code in UNAVAILABLE_CODES or bool(error.retriable())


def describe(error: KafkaError) -> str:
    """`MSG_SIZE_TOO_LARGE: Broker: Message size too large`, for last_error and logs."""
    return f"{error.name()}: {_ERROR_TAIL.sub('', error.str())}"


def refusal(error: KafkaError, settings: RelaySettings) -> KafkaRefusedError:
    """The one line an operator reads when the broker refused the relay."""
    security = settings.security
    if error.code() in {KafkaError._SSL, KafkaError._TRANSPORT}:
        check = ("KAFKA_SSL_CA_LOCATION (the CA that signed the broker's certificate), "
                 "KAFKA_SSL_ENDPOINT_IDENTIFICATION, and KAFKA_SSL_CERTIFICATE_LOCATION and "
                 "KAFKA_SSL_KEY_LOCATION (the client certificate the broker may demand)")
    else:
        check = "KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"
    how = security.protocol + (f" {security.sasl_mechanism}" if security.uses_sasl else "")
    return KafkaRefusedError(redact(f"kafka refused the relay ({how}): {describe(error)}; check {check}",
                               settings))


def secrets(settings: RelaySettings) -> list[str]:
    """Every secret value in the settings, to scrub from any text shown."""
    security = settings.security
    values = [s.value for s in (security.sasl_password, security.ssl_key_password) if s]
    values += [str(v) for k, v in settings.extra_properties if _SECRET_NAME.search(k)]
    return [v for v in values if v]


def redact(text: str, settings: RelaySettings) -> str:
    for secret in secrets(settings):
        text = text.replace(secret, "***")
    return text


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


def extra_properties(settings: RelaySettings) -> dict[str, Any]:
    """KAFKA_PRODUCER_CONFIG, refused (ConfigError) if it touches a guarded property."""
    for name, _value in settings.extra_properties:
        key = name.strip().lower()
        if key in GUARDED_PROPERTIES:
            raise ConfigError(PROPERTIES_VAR, f"may not set {name!r}: {GUARDED_PROPERTIES[key]}")
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
        "linger.ms": int(settings.linger.total_seconds() * 1000),
        "message.timeout.ms": int(settings.delivery_timeout.total_seconds() * 1000),
        "queue.buffering.max.messages": max(100_000, 2 * settings.batch_size),
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


class RepeatFilter:
    """Lets a line through once per `window_s` seconds; librdkafka repeats a failing connection's
    error every reconnect (twice a second), which would flood the log."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._last: dict[str, float] = {}

    def fresh(self, line: str) -> bool:
        key = _ERROR_TAIL.sub("", line)
        now = time.monotonic()
        if now - self._last.get(key, -self.window_s) < self.window_s:
            return False
        self._last[key] = now
        return True


# librdkafka's log facilities whose failures the relay reports itself: a failed connection
# (FAIL, ERROR) reaches its error callback and so the outage log (outbox.outage), a fatal
# error (FATAL) its "producer failed fatally" line. Logging both would say each failure twice.
REPORTED_FACILITIES = frozenset({"FAIL", "ERROR", "FATAL"})


class LibrdkafkaLog:
    """librdkafka's own log lines into `outbox.kafka`, without the failures the relay reports
    itself (REPORTED_FACILITIES), without repeats, and with any secret scrubbed."""

    def __init__(self, hidden: list[str] | None = None) -> None:
        self._repeats = RepeatFilter()
        self._hidden = hidden or []

    def log(self, level: int, fmt: str, *args: Any) -> None:
        facility = args[0] if args else ""
        line = fmt % args if args else fmt
        if facility not in REPORTED_FACILITIES and self._repeats.fresh(line):
            for secret in self._hidden:
                line = line.replace(secret, "***")
            logger.log(level, "%s", line)


def new_producer(settings: RelaySettings, client_id: str, on_error: Any = None,
                 on_statistics: Any = None) -> Producer:
    config = producer_config(settings, client_id)
    if on_error is not None:
        config["error_cb"] = on_error
    if on_statistics is not None:
        config["stats_cb"] = on_statistics
    return Producer(config)


def record_headers(message: ClaimedMessage) -> dict[str, str]:
    """The row's headers as the producer takes them: every value text (UTF-8 on the wire); a
    value stored as another JSON type is sent as its JSON text."""
    return {name: value if isinstance(value, str) else json.dumps(value)
            for name, value in message.headers.items()}
