"""Which Kafka errors mean "the broker is unavailable" (wait and retry, no attempt counted),
"this partition cannot take it now" (a kind of the first: defer it, no attempt counted),
"this message cannot be delivered" (count an attempt, park it eventually), or "the broker
refused the relay" (wrong credentials or certificate, or a principal that may not produce:
stop, exit 1); and how an error is shown."""

import re

from confluent_kafka import KafkaError

from outbox.config import RelaySettings
from outbox.redaction import redact

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
# fatal). Waiting does not change that.
REFUSED_CODES = frozenset({
    KafkaError._AUTHENTICATION,
    KafkaError._SSL,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.UNSUPPORTED_SASL_MECHANISM,
    KafkaError.ILLEGAL_SASL_STATE,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
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
