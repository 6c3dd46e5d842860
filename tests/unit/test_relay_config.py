"""The relay's settings as read from the environment, without a database: a bad value names its
variable, the defaults, the deprecated claim TTL, the outage and statistics intervals."""

from datetime import timedelta

import pytest

from core.config import ConfigError
from outbox import kafka
from outbox.config import RelaySettings, load_relay_settings, off_allowlist_error
from outbox.kafka import RepeatFilter
from reminders import events


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({}, "KAFKA_BOOTSTRAP_SERVERS"),
        ({"KAFKA_BOOTSTRAP_SERVERS": ""}, "KAFKA_BOOTSTRAP_SERVERS"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "localhost"}, "KAFKA_BOOTSTRAP_SERVERS"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "a:1,b:x"}, "KAFKA_BOOTSTRAP_SERVERS"),
        ({"OUTBOX_BATCH_SIZE": "0"}, "OUTBOX_BATCH_SIZE"),
        ({"OUTBOX_BATCH_SIZE": "many"}, "OUTBOX_BATCH_SIZE"),
        ({"OUTBOX_BATCH_SIZE": "1000000"}, "OUTBOX_BATCH_SIZE"),
        ({"OUTBOX_BATCH_SIZE_MIN": "0"}, "OUTBOX_BATCH_SIZE_MIN"),
        ({"OUTBOX_BATCH_SIZE_MIN": "few"}, "OUTBOX_BATCH_SIZE_MIN"),
        ({"OUTBOX_BATCH_SIZE_MIN": "6000"}, "OUTBOX_BATCH_SIZE_MIN"),
        ({"OUTBOX_BATCH_SIZE": "500", "OUTBOX_BATCH_SIZE_MIN": "501"}, "OUTBOX_BATCH_SIZE_MIN"),
        ({"OUTBOX_POLL_INTERVAL": "0s"}, "OUTBOX_POLL_INTERVAL"),
        ({"OUTBOX_RETENTION": "a week"}, "OUTBOX_RETENTION"),
        ({"OUTBOX_MAX_ATTEMPTS": "-1"}, "OUTBOX_MAX_ATTEMPTS"),
        ({"OUTBOX_SHUTDOWN_GRACE": "-3s"}, "OUTBOX_SHUTDOWN_GRACE"),
        ({"OUTBOX_BACKOFF_INITIAL": "2m"}, "OUTBOX_BACKOFF_MAX"),
        ({"OUTBOX_LINGER": "soon"}, "OUTBOX_LINGER"),
        ({"OUTBOX_OUTAGE_LOG_INTERVAL": "0s"}, "OUTBOX_OUTAGE_LOG_INTERVAL"),
        ({"OUTBOX_OUTAGE_LOG_INTERVAL": "every minute"}, "OUTBOX_OUTAGE_LOG_INTERVAL"),
        ({"OUTBOX_STATISTICS_INTERVAL": "0"}, "OUTBOX_STATISTICS_INTERVAL"),
        ({"OUTBOX_STATISTICS_INTERVAL": "2d"}, "OUTBOX_STATISTICS_INTERVAL"),
        ({"OUTBOX_TOPICS": ""}, "OUTBOX_TOPICS"),
        ({"OUTBOX_TOPICS": " , "}, "OUTBOX_TOPICS"),
        ({"OUTBOX_TOPICS": "a,,b"}, "OUTBOX_TOPICS"),
        ({"OUTBOX_TOPICS": "pin.profile.*"}, "OUTBOX_TOPICS"),
        ({"OUTBOX_TOPICS": "two words"}, "OUTBOX_TOPICS"),
        ({"OUTBOX_TOPICS": ".."}, "OUTBOX_TOPICS"),
        ({"OUTBOX_TOPICS": "t" * 250}, "OUTBOX_TOPICS"),
    ],
)
def test_bad_configuration_names_the_variable(environ: dict[str, str], variable: str) -> None:
    full = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092", **environ}
    if not environ:
        full = {}
    with pytest.raises(ConfigError) as raised:
        load_relay_settings(full)
    assert raised.value.name == variable
    assert str(raised.value).startswith(f"{variable}: ")


def test_configuration_defaults() -> None:
    settings = load_relay_settings({"KAFKA_BOOTSTRAP_SERVERS": " k1:9092, k2:9092 "})
    assert settings == RelaySettings(bootstrap_servers="k1:9092,k2:9092")
    assert settings.retention == timedelta(days=7)
    assert (settings.batch_size, settings.batch_size_min) == (5000, 100)
    assert settings.outage_log_interval == timedelta(seconds=60)
    assert settings.statistics_interval == timedelta(seconds=15)
    assert settings.topics == {events.TOPIC}  # the contract's topic, and no other


def test_the_topic_allowlist_is_read_and_names_itself_in_a_refusal() -> None:
    settings = load_relay_settings({"KAFKA_BOOTSTRAP_SERVERS": "k:9092",
                                    "OUTBOX_TOPICS": f" {events.TOPIC}, pin.other_topic-2 ,"
                                                     f"{events.TOPIC}"})
    assert settings.topics == {events.TOPIC, "pin.other_topic-2"}
    assert off_allowlist_error("payments.v1\n", settings.topics) == (
        "topic 'payments.v1\\n' is not on OUTBOX_TOPICS (pin.other_topic-2, "
        f"{events.TOPIC}): never sent, parked")


@pytest.mark.parametrize("claim_ttl", ["1s", "2m", "not a duration"])
def test_the_claim_ttl_is_accepted_with_a_deprecation_warning_and_nothing_else(
    claim_ttl: str,
) -> None:
    """No row is leased any more: OUTBOX_CLAIM_TTL, whatever its value or the delivery timeout,
    changes nothing but a DeprecationWarning."""
    base = {"KAFKA_BOOTSTRAP_SERVERS": "k1:9092", "OUTBOX_DELIVERY_TIMEOUT": "5m"}
    with pytest.deprecated_call(match="OUTBOX_CLAIM_TTL is deprecated and ignored"):
        settings = load_relay_settings({**base, "OUTBOX_CLAIM_TTL": claim_ttl})
    assert settings == load_relay_settings(base)


def test_the_outage_and_statistics_intervals_are_read() -> None:
    settings = load_relay_settings({"KAFKA_BOOTSTRAP_SERVERS": "k1:9092",
                                    "OUTBOX_OUTAGE_LOG_INTERVAL": "5m",
                                    "OUTBOX_STATISTICS_INTERVAL": "500ms"})
    assert settings.outage_log_interval == timedelta(minutes=5)
    assert settings.statistics_interval == timedelta(milliseconds=500)


@pytest.mark.parametrize(
    ("environ", "sizes"),
    [
        # An operator's OUTBOX_BATCH_SIZE is the largest read; below the default smallest read
        # it is the only one (a small setting keeps its meaning).
        ({"OUTBOX_BATCH_SIZE": "500"}, (500, 100)),
        ({"OUTBOX_BATCH_SIZE": "50"}, (50, 100)),
        # Both set alike: the fixed read size of the releases before reads grew.
        ({"OUTBOX_BATCH_SIZE": "500", "OUTBOX_BATCH_SIZE_MIN": "500"}, (500, 500)),
        ({"OUTBOX_BATCH_SIZE_MIN": "20"}, (5000, 20)),
    ],
)
def test_the_batch_sizes_an_operator_sets(environ: dict[str, str], sizes: tuple[int, int]) -> None:
    settings = load_relay_settings({"KAFKA_BOOTSTRAP_SERVERS": "k1:9092", **environ})
    assert (settings.batch_size, settings.batch_size_min) == sizes


def test_the_batch_size_option_stands_for_the_variable_and_is_checked_with_the_rest() -> None:
    """publish_outbox --batch-size is read as OUTBOX_BATCH_SIZE, before the cross-field checks."""
    environ = {"KAFKA_BOOTSTRAP_SERVERS": "k1:9092", "OUTBOX_BATCH_SIZE": "500"}
    settings = load_relay_settings(environ, batch_size="7")
    assert (settings.batch_size, settings.batch_size_min) == (7, 100)
    with pytest.raises(ConfigError) as raised:
        load_relay_settings({**environ, "OUTBOX_BATCH_SIZE_MIN": "200"}, batch_size="50")
    assert str(raised.value) == "OUTBOX_BATCH_SIZE_MIN: must be at most --batch-size (50), got 200"


@pytest.mark.parametrize("prop", [
    "enable.ssl.certificate.verification", "ssl.ca.pem", "ssl.ca.certificate.stores",
    "ssl.keystore.location", "ssl.keystore.password", "ssl.cipher.suites", "ssl_key",
    "sasl.oauthbearer.config", "sasl.kerberos.service.name", "SSL.CA.Location",
    "enable.sasl.oauthbearer.unsecure.jwt",
])
def test_no_tls_or_sasl_property_may_be_set_by_the_extra_properties(prop: str) -> None:
    settings = load_relay_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
                                    "KAFKA_PRODUCER_CONFIG": f'{{"{prop}": "false"}}'})
    with pytest.raises(ConfigError) as raised:
        kafka.producer_config(settings, "relay-x")
    assert raised.value.name == "KAFKA_PRODUCER_CONFIG" and repr(prop) in str(raised.value)


PLAIN_CLEARTEXT = {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "plain",
                   "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p"}


@pytest.mark.parametrize(("bootstrap", "allow", "variable"), [
    ("127.0.0.1:9092", None, "KAFKA_SASL_MECHANISM"),
    ("kafka.example.com:9092", None, "KAFKA_SASL_MECHANISM"),
    ("kafka.example.com:9092", "PLAIN", "KAFKA_SASL_PLAINTEXT_ALLOW"),
    ("localhost:9092,10.0.0.5:9092", "PLAIN", "KAFKA_SASL_PLAINTEXT_ALLOW"),
    ("127.0.0.1:9092", "yes", "KAFKA_SASL_PLAINTEXT_ALLOW"),
])
def test_plain_over_sasl_plaintext_is_refused_unless_named_for_a_loopback_broker(
    bootstrap: str, allow: str | None, variable: str,
) -> None:
    environ = {**PLAIN_CLEARTEXT, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    if allow is not None:
        environ["KAFKA_SASL_PLAINTEXT_ALLOW"] = allow
    with pytest.raises(ConfigError) as raised:
        load_relay_settings(environ)
    assert raised.value.name == variable
    assert "p" not in str(raised.value).split(": ", 1)[0]


def test_plain_over_sasl_plaintext_is_taken_for_a_loopback_broker_when_named() -> None:
    settings = load_relay_settings({**PLAIN_CLEARTEXT, "KAFKA_SASL_PLAINTEXT_ALLOW": "PLAIN",
                                    "KAFKA_BOOTSTRAP_SERVERS": "localhost:9092,[::1]:9093"})
    assert settings.security.sasl_mechanism == "PLAIN"
    scram = load_relay_settings({**PLAIN_CLEARTEXT, "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                                 "KAFKA_BOOTSTRAP_SERVERS": "kafka.example.com:9092"})
    assert scram.security.sasl_mechanism == "SCRAM-SHA-512"


def test_the_repeat_filter_remembers_a_bounded_number_of_lines() -> None:
    repeats = RepeatFilter(window_s=60, max_lines=100)
    assert all(repeats.fresh(f"connection to broker-{n}:9092 failed") for n in range(10_000))
    assert len(repeats) == 100
    assert not repeats.fresh("connection to broker-9999:9092 failed")  # recent: still a repeat
    assert repeats.fresh("connection to broker-0:9092 failed")  # forgotten long ago


@pytest.mark.parametrize(("timeout", "socket_ms"), [("5s", 5_000), ("30s", 30_000), ("10m", 300_000)])
def test_no_request_waits_on_a_broker_longer_than_the_delivery_timeout(
        timeout: str, socket_ms: int) -> None:
    """librdkafka's 60 s would let a request sent to a stopped broker (metadata, an
    idempotence id) hold back that connection's requests for a minute (its maximum: 300 s)."""
    settings = load_relay_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
                                    "OUTBOX_DELIVERY_TIMEOUT": timeout})
    assert kafka.producer_config(settings, "relay-x")["socket.timeout.ms"] == socket_ms
    guarded = load_relay_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
                                   "KAFKA_PRODUCER_CONFIG": '{"socket.timeout.ms": 60000}'})
    with pytest.raises(ConfigError):
        kafka.producer_config(guarded, "relay-x")
