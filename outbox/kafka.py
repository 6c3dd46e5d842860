"""The relay's Kafka client, below the producer (docs/outbox-relay.md, "A secured Kafka"):

- which Kafka errors mean "the broker is unavailable" (wait and retry, no attempt counted), "this
  partition cannot take it now" (a kind of the first: defer it, no attempt counted), "this message
  cannot be delivered" (count an attempt, park it eventually), or "the broker refused the relay"
  (wrong credentials or certificate, or a principal that may not produce: stop, exit 1); and how
  an error is shown;
- secrets out of any text the relay shows (the settings' passwords, and the values of
  KAFKA_PRODUCER_CONFIG's properties whose names say they are secret);
- librdkafka's own log lines, into the `outbox.kafka` logger;
- the producer's configuration: the security settings, the extra librdkafka properties (which
  may not touch what the guarantees rest on, GUARDED_PROPERTIES), and an outbox row's headers as
  a Kafka record takes them;
- a Kafka outage in a few log lines ("A broker outage in the log"): librdkafka reports a failing
  connection on every reconnect attempt, and the relay sees a failed batch after every backoff:
  logged as they come, a day's outage was hundreds of thousands of lines. `OutageLog` says the
  first failure at once, then at most one line per interval with the failures repeated since the
  previous line, and one line when the connection is back. An outage that starts within the
  interval after the previous line (a connection that flaps) is held back until the interval is
  over, so the log never carries more than one failure line and one recovery line per interval.
  `PartitionOutages` keeps one such log per partition that could not take rows while the rest of
  the cluster took them ("One partition's outage"), with lines of its own.
"""

import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from core.config import ConfigError
from outbox.config import PROPERTIES_VAR, Clock, Emit, KafkaSecurity, RelaySettings

# --- Kafka's errors, sorted by what the relay does about them -----------------------------------

# librdkafka's variable tail of an error: "(after 31ms in state AUTH_REQ, 2 identical ...)".
ERROR_TAIL = re.compile(r"\s*\(after [0-9]+ms in state [A-Z_]+[^)]*\)")

# The idempotent producer's state, not the message: a restarted broker forgot the producer (or,
# Tansu, gave its id to a newer one: PRODUCER_FENCED). The producer is replaced.
PRODUCER_STATE_CODES = frozenset({
    KafkaError.UNKNOWN_PRODUCER_ID,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.PRODUCER_FENCED,
})

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
    *PRODUCER_STATE_CODES,
})

# One partition cannot take a message now (no leader, too few in-sync replicas, its leader not
# answering in time): the rest of the cluster may well take the others.
PARTITION_UNAVAILABLE_CODES = frozenset({
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.KAFKA_STORAGE_ERROR,
})

# The client stopped waiting (the message's delivery timeout ran out): it says nothing of whether
# the cluster answers. A partition whose leader is gone, and a broker that died, look the same.
LOCAL_TIMEOUT_CODES = frozenset({KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT})

# The client gave up on a message it may already have sent (its request was in flight): the
# leader may still append it, or may have appended it and not answered in time.
POSSIBLY_APPENDED_CODES = frozenset({KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT,
                                     KafkaError._PURGE_INFLIGHT})

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
# (certificate not trusted, host name mismatch); or its principal may not produce at all (the
# idempotent producer's id is refused without Write on any topic: CLUSTER_AUTHORIZATION_FAILED,
# fatal), or may not write a topic on OUTBOX_TOPICS (TOPIC_AUTHORIZATION_FAILED, for each
# record, once it has its producer id). Waiting does not change that.
REFUSED_CODES = frozenset({
    KafkaError._AUTHENTICATION,
    KafkaError._SSL,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.UNSUPPORTED_SASL_MECHANISM,
    KafkaError.ILLEGAL_SASL_STATE,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
})

# The broker knows the client, and its ACLs do not allow what it asked (docs/operations.md,
# "Kafka ACLs").
NOT_AUTHORIZED_CODES = frozenset({
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
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


def partition_unavailable(error: KafkaError) -> bool:
    """True when `error` says only that the message's partition could not take it now (not the
    producer, not the connection to every broker, not the message)."""
    return not error.fatal() and error.code() in PARTITION_UNAVAILABLE_CODES


def local_timeout(error: KafkaError) -> bool:
    """True when `error` is this client giving up on the message, not any broker's answer."""
    return error.code() in LOCAL_TIMEOUT_CODES


def possibly_appended(error: KafkaError) -> bool:
    """True when `error` leaves the message possibly on the topic all the same (librdkafka does
    not say whether its request had left: a time-out in the client counts as possibly sent)."""
    return error.code() in POSSIBLY_APPENDED_CODES


def describe(error: KafkaError) -> str:
    """`MSG_SIZE_TOO_LARGE: Broker: Message size too large`, for last_error and logs."""
    return f"{error.name()}: {ERROR_TAIL.sub('', error.str())}"


def not_authorized(error: KafkaError) -> bool:
    """True when the broker's ACLs do not allow this client what it asked."""
    return error.code() in NOT_AUTHORIZED_CODES


def principal(settings: RelaySettings) -> str:
    """Who the broker's ACLs name: the SASL user, the client certificate's subject, or (neither)
    User:ANONYMOUS."""
    security = settings.security
    if security.uses_sasl:
        return f"User:{security.sasl_username}"
    if security.ssl_certificate_location:
        return "the principal of the client certificate"
    return "User:ANONYMOUS"


def refusal(error: KafkaError, settings: RelaySettings) -> KafkaRefusedError:
    """The one line an operator reads when the broker refused the relay."""
    security = settings.security
    if error.code() in {KafkaError._SSL, KafkaError._TRANSPORT}:
        check = ("KAFKA_SSL_CA_LOCATION (the CA that signed the broker's certificate), "
                 "KAFKA_SSL_ENDPOINT_IDENTIFICATION, and KAFKA_SSL_CERTIFICATE_LOCATION and "
                 "KAFKA_SSL_KEY_LOCATION (the client certificate the broker may demand)")
    elif not_authorized(error):
        check = (f"the ACLs of {principal(settings)}: Write and DescribeConfigs on the topic "
                 "(docs/operations.md, \"Kafka ACLs\")")
    else:
        check = "KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"
    how = security.protocol + (f" {security.sasl_mechanism}" if security.uses_sasl else "")
    return KafkaRefusedError(redact(f"kafka refused the relay ({how}): {describe(error)}; check {check}",
                               settings))


# --- secrets out of any text shown -----------------------------------------------------------

# Property names whose values are secrets: never shown, even from KAFKA_PRODUCER_CONFIG.
_SECRET_NAME = re.compile(r"password|secret|token|\.pem$|credential")


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


def redacting(emit: Emit, settings: RelaySettings) -> Emit:
    """`emit`, its `error` field (librdkafka's text) scrubbed, as every line that shows it."""

    def say(level: int, event: str, fields: dict[str, Any]) -> None:
        if "error" in fields:
            fields = {**fields, "error": redact(fields["error"], settings)}
        emit(level, event, fields)

    return say


# --- librdkafka's own log ---------------------------------------------------------------------

logger = logging.getLogger("outbox.kafka")


class RepeatFilter:
    """Lets a line through once per `window_s` seconds; librdkafka repeats a failing connection's
    error every reconnect (twice a second), which would flood the log. It remembers at most
    `max_lines` distinct lines, the least recently let through forgotten first (a flood of
    distinct lines, a broker's address per line say, must not grow the process)."""

    def __init__(self, window_s: float = 60.0, max_lines: int = 1_000) -> None:
        self.window_s = window_s
        self.max_lines = max_lines
        self._last: OrderedDict[str, float] = OrderedDict()

    def fresh(self, line: str) -> bool:
        key = ERROR_TAIL.sub("", line)
        now = time.monotonic()
        if now - self._last.get(key, -self.window_s) < self.window_s:
            return False
        self._last[key] = now
        self._last.move_to_end(key)
        while len(self._last) > self.max_lines:
            self._last.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._last)


# librdkafka's log facilities whose failures the relay reports itself: a failed connection
# (FAIL, ERROR) reaches its error callback and so the outage log (OutageLog), a fatal
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


# --- the producer's configuration --------------------------------------------------------------

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
    """An admin client's (outbox.topic_watch reads the topics' metadata and configuration with it):
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


# librdkafka refuses a socket.timeout.ms above 5 minutes.
MAX_SOCKET_TIMEOUT_MS = 300_000


def producer_config(settings: RelaySettings, client_id: str) -> dict[str, Any]:
    """An idempotent producer (acks=all) whose deliveries end within the delivery timeout, with
    the security settings and the extra properties (which cannot override the guarded ones)."""
    delivery_ms = int(settings.delivery_timeout.total_seconds() * 1000)
    return {
        **extra_properties(settings),
        **client_config(settings),
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": PARTITIONER,
        "linger.ms": int(settings.linger.total_seconds() * 1000),
        "message.timeout.ms": delivery_ms,
        # No request waits on a broker longer than a message may (librdkafka's default is 60 s):
        # a broker that stopped answering is disconnected then, and a metadata or idempotence-id
        # request that went to it, holding back that connection's requests, is asked elsewhere.
        "socket.timeout.ms": min(MAX_SOCKET_TIMEOUT_MS, delivery_ms),
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
    """The producer of rows whose earlier attempt may already be on the topic (outbox.producer):
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


# --- a Kafka outage in a few log lines -----------------------------------------------------------

FAILING = "kafka connection failing"
STILL_FAILING = "kafka connection still failing"
RESTORED = "kafka connection restored"
PARTITION_FAILING = "kafka partition unavailable"
PARTITION_STILL_FAILING = "kafka partition still unavailable"
PARTITION_RESTORED = "kafka partition available again"

Partition = tuple[str, int]  # (topic, partition); -1 when none was assigned to the row yet


class OutageLog:
    """Deduplicates the relay's "cannot reach Kafka" reports: call `failed()` for every one,
    `restored()` when a delivery succeeded or the statistics show a broker up."""

    def __init__(self, emit: Emit, *, interval_s: float, clock: Clock = time.monotonic,
                 events: tuple[str, str, str] = (FAILING, STILL_FAILING, RESTORED),
                 counted: str = "released") -> None:
        self._emit = emit
        self.interval_s = interval_s
        self._clock = clock
        self._events = events  # (first failure, repeated failures, restored)
        self._counted = counted  # the name of the messages-handed-back field
        self._failing_since: float | None = None
        self._failures = 0  # in this outage
        self._unreported = 0  # failures since the last line
        self._released = 0  # messages released since the last line
        self._said_failing = False  # this outage has had a line
        self._last_line: float | None = None  # the last failure line, of any outage

    @property
    def failing(self) -> bool:
        return self._failing_since is not None

    def failed(self, error: str, *, released: int = 0) -> None:
        """One failure: a connection error, or a batch the broker did not take (`released`
        messages handed back)."""
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
            self._failures = 0
            self._said_failing = False
        self._failures += 1
        self._unreported += 1
        self._released += released
        if self._last_line is not None and now - self._last_line < self.interval_s:
            return
        fields: dict[str, Any] = {"error": error, "repeats": self._unreported - 1,
                                  "failing_for_s": round(now - self._failing_since, 1)}
        if self._released:
            fields[self._counted] = self._released
        self._emit(logging.WARNING, self._events[1] if self._said_failing else self._events[0],
                   fields)
        self._said_failing = True
        self._last_line = now
        self._unreported = self._released = 0

    def restored(self) -> None:
        """Kafka answers again; one line if the outage was reported, none otherwise."""
        if self._failing_since is None:
            return
        if self._said_failing:
            fields: dict[str, Any] = {
                "failing_for_s": round(self._clock() - self._failing_since, 1),
                "failures": self._failures}
            if self._released:
                fields[self._counted] = self._released
            self._emit(logging.INFO, self._events[2], fields)
            self._unreported = self._released = 0
        self._failing_since = None


class PartitionOutages:
    """The partitions that could not take rows while the cluster took others: an outage log
    for each (its lines carry the topic and partition), how many batches in a row each failed
    (its rows' retry delay grows with it), and the partition each deferred key was bound for
    (a delivery of that key says the partition is back, and its other keys are due at once:
    `take_due`)."""

    def __init__(self, emit: Emit, *, interval_s: float, clock: Clock = time.monotonic) -> None:
        self._emit = emit
        self.interval_s = interval_s
        self._clock = clock
        self._logs: dict[Partition, OutageLog] = {}
        self._failures: dict[Partition, int] = {}
        self._keys: dict[str, Partition] = {}
        # Keys deferred for a partition that is back: their waiting rows are due at once.
        self._due: list[str] = []

    @property
    def down(self) -> set[Partition]:
        """The partitions in an outage now."""
        return set(self._failures)

    def failed(self, partition: Partition, keys: Iterable[str], error: str) -> int:
        """A batch's rows of `keys` deferred for `partition`: its batches failed in a row,
        this one included."""
        keys = list(keys)
        self._keys.update((key, partition) for key in keys)
        failures = self._failures[partition] = self._failures.get(partition, 0) + 1
        self._log(partition).failed(error, released=len(keys))
        return failures

    def delivered(self, keys: Iterable[str]) -> set[Partition]:
        """Rows of `keys` delivered: the partitions they were deferred for are back."""
        back = {p for p in (self._keys.pop(key, None) for key in keys) if p is not None}
        back &= set(self._failures)
        for partition in back:
            self._back(partition)
        return back

    def ready(self, topic: str, number: int) -> bool:
        """The topic's metadata shows the partition able to take rows again (TopicWatch): if it
        was in an outage it is back, and True."""
        partition = (topic, number)
        if partition not in self._failures:
            return False
        self._back(partition)
        return True

    def take_due(self) -> list[str]:
        """The keys whose partition came back since the last call (their rows wait no longer)."""
        due, self._due = self._due, []
        return due

    def _back(self, partition: Partition) -> None:
        """Its other deferred keys are due at once; a later outage starts afresh."""
        self._due.extend(k for k, p in self._keys.items() if p == partition)
        self._keys = {k: p for k, p in self._keys.items() if p != partition}
        del self._failures[partition]
        self._log(partition).restored()

    def _log(self, partition: Partition) -> OutageLog:
        if partition not in self._logs:
            topic, number = partition

            def emit(level: int, event: str, fields: dict[str, Any]) -> None:
                self._emit(level, event, {"topic": topic, "partition": number, **fields})

            self._logs[partition] = OutageLog(
                emit, interval_s=self.interval_s, clock=self._clock, counted="deferred",
                events=(PARTITION_FAILING, PARTITION_STILL_FAILING, PARTITION_RESTORED))
        return self._logs[partition]
