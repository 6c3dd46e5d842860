"""The relay on a secured Kafka (docs/outbox-relay.md, "A secured Kafka"): the settings and how
they reach librdkafka; TLS through socat in front of Tansu, the broker's certificate verified
against the configured CA (and its host name), a client certificate with an encrypted key;
SASL/SCRAM refused by a Tansu that demands authentication. No broker here can let a SASL user
in (see the docs), so the SASL tests are the refusal: exit 4, one line, nothing published."""

import subprocess
import uuid
from pathlib import Path

import pytest

from core.config import ConfigError
from outbox import kafka
from outbox.config import PROTOCOLS, KafkaSecurity, load_relay_settings
from tests.acceptance.test_relay_process import relay_env, run_relay, start_relay
from tests.support import chaos_report
from tests.support.processes import manage_py
from tests.support.relay_support import BASE_TIME, insert_outbox, interleaved_rows, outbox_state
from tests.support.tansu_support import Certificates, TansuBroker, TlsFront, reserve_port

PASSWORD = "sasl-Pa55-" + uuid.uuid4().hex
BOOT = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092"}


def sasl(protocol: str = "SASL_SSL", mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
    return {"KAFKA_SECURITY_PROTOCOL": protocol, "KAFKA_SASL_MECHANISM": mechanism,
            "KAFKA_SASL_USERNAME": "pin_outbox_relay", "KAFKA_SASL_PASSWORD": PASSWORD}


# --- settings -------------------------------------------------------------------------------


def test_sasl_ssl_settings_reach_librdkafka_and_the_password_is_never_shown(
    certificates: Certificates,
) -> None:
    settings = load_relay_settings({
        **BOOT, **sasl(protocol="sasl_ssl", mechanism="scram-sha-256"),
        "KAFKA_SSL_CA_LOCATION": str(certificates.ca),
        "KAFKA_SSL_CERTIFICATE_LOCATION": str(certificates.client),
        "KAFKA_SSL_KEY_LOCATION": str(certificates.client_key),
        "KAFKA_SSL_KEY_PASSWORD": certificates.key_password,
        "KAFKA_PRODUCER_CONFIG": '{"socket.keepalive.enable": true, "client.rack": "eu-1a"}',
    })
    config = kafka.producer_config(settings, "relay-x")

    assert {k: v for k, v in config.items() if k.startswith(("security", "sasl", "ssl"))} == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "pin_outbox_relay", "sasl.password": PASSWORD,
        "ssl.ca.location": str(certificates.ca),
        "ssl.certificate.location": str(certificates.client),
        "ssl.key.location": str(certificates.client_key),
        "ssl.key.password": certificates.key_password,
        "ssl.endpoint.identification.algorithm": "https",
    }
    assert config["socket.keepalive.enable"] is True and config["client.rack"] == "eu-1a"
    assert (config["enable.idempotence"], config["acks"]) == (True, "all")
    kafka.check_producer_config(settings)  # librdkafka takes it, key password and all
    shown = f"{settings!r} {settings} {settings.security.sasl_password}"
    assert PASSWORD not in shown and certificates.key_password not in shown


def test_plaintext_is_the_default_and_sets_no_sasl_or_tls_property() -> None:
    settings = load_relay_settings(BOOT)
    assert settings.security == KafkaSecurity()
    config = kafka.producer_config(settings, "relay-x")
    assert config["security.protocol"] == "PLAINTEXT"
    assert not [k for k in config if k.startswith(("sasl.", "ssl."))]


def test_hostname_verification_can_be_turned_off_explicitly(certificates: Certificates) -> None:
    settings = load_relay_settings({**BOOT, "KAFKA_SECURITY_PROTOCOL": "SSL",
                                    "KAFKA_SSL_ENDPOINT_IDENTIFICATION": "none"})
    assert kafka.producer_config(settings, "r")["ssl.endpoint.identification.algorithm"] == "none"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_protocol_is_accepted_with_what_it_needs(protocol: str) -> None:
    environ = {**BOOT, "KAFKA_SECURITY_PROTOCOL": protocol.lower()}
    if protocol.startswith("SASL_"):
        environ.update(sasl(protocol))
    assert load_relay_settings(environ).security.protocol == protocol


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "KAFKA_SECURITY_PROTOCOL"),
        ({**sasl(), "KAFKA_SASL_MECHANISM": "GSSAPI"}, "KAFKA_SASL_MECHANISM"),
        ({**sasl(), "KAFKA_SASL_MECHANISM": ""}, "KAFKA_SASL_MECHANISM"),
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "KAFKA_SASL_MECHANISM"),
        ({**sasl(), "KAFKA_SASL_USERNAME": " "}, "KAFKA_SASL_USERNAME"),
        ({k: v for k, v in sasl().items() if k != "KAFKA_SASL_PASSWORD"}, "KAFKA_SASL_PASSWORD"),
        ({**sasl(), "KAFKA_SASL_PASSWORD": ""}, "KAFKA_SASL_PASSWORD"),
        ({"KAFKA_SASL_USERNAME": "relay"}, "KAFKA_SASL_USERNAME"),  # PLAINTEXT ignores it
        ({"KAFKA_SSL_CA_LOCATION": "/etc/hostname"}, "KAFKA_SSL_CA_LOCATION"),  # PLAINTEXT
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CA_LOCATION": "/nonexistent/ca.pem"},
         "KAFKA_SSL_CA_LOCATION"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CA_LOCATION": "/etc"},
         "KAFKA_SSL_CA_LOCATION"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERTIFICATE_LOCATION": "/etc/hostname"},
         "KAFKA_SSL_KEY_LOCATION"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_KEY_LOCATION": "/etc/hostname"},
         "KAFKA_SSL_CERTIFICATE_LOCATION"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_KEY_PASSWORD": "x"},
         "KAFKA_SSL_KEY_PASSWORD"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_ENDPOINT_IDENTIFICATION": "off"},
         "KAFKA_SSL_ENDPOINT_IDENTIFICATION"),
        ({"KAFKA_PRODUCER_CONFIG": "acks=all"}, "KAFKA_PRODUCER_CONFIG"),
        ({"KAFKA_PRODUCER_CONFIG": '["acks"]'}, "KAFKA_PRODUCER_CONFIG"),
        ({"KAFKA_PRODUCER_CONFIG": '{"debug": ["all"]}'}, "KAFKA_PRODUCER_CONFIG"),
        ({"KAFKA_PRODUCER_CONFIG": '{"debug": null}'}, "KAFKA_PRODUCER_CONFIG"),
    ],
)
def test_a_bad_security_setting_names_its_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_relay_settings({**BOOT, **environ})
    assert raised.value.name == variable
    assert PASSWORD not in str(raised.value)


@pytest.mark.parametrize(
    "prop",
    ["enable.idempotence", "acks", "request.required.acks", "message.timeout.ms",
     "delivery.timeout.ms", "transactional.id", "bootstrap.servers", "linger.ms", "client.id",
     "security.protocol", "sasl.password", "ssl.ca.location", "Acks", "error_cb",
     "statistics.interval.ms", "stats_cb", "partitioner", "partitioner_cb"],
)
def test_extra_properties_may_not_touch_what_the_guarantees_rest_on(prop: str) -> None:
    settings = load_relay_settings({**BOOT, "KAFKA_PRODUCER_CONFIG": f'{{"{prop}": "1"}}'})
    with pytest.raises(ConfigError) as raised:
        kafka.producer_config(settings, "relay-x")
    assert raised.value.name == "KAFKA_PRODUCER_CONFIG" and repr(prop) in str(raised.value)


@pytest.mark.parametrize(
    ("extra", "variable", "shown"),
    [
        ({"KAFKA_PRODUCER_CONFIG": '{"no.such.property": 1}'}, "KAFKA_PRODUCER_CONFIG",
         "no.such.property"),
        ({"KAFKA_PRODUCER_CONFIG": '{"max.in.flight": 50}'}, "KAFKA_PRODUCER_CONFIG",
         "max.in.flight"),
        ({"KAFKA_PRODUCER_CONFIG": f'{{"sasl.oauthbearer.client.secret": "{PASSWORD}",'
          ' "socket.timeout.ms": "soon"}'}, "KAFKA_PRODUCER_CONFIG",
         "sasl.oauthbearer.client.secret"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CA_LOCATION": "/etc/hostname"},
         "KAFKA_SSL_CA_LOCATION", "ssl.ca.location"),
    ],
)
def test_librdkafka_checks_every_property_offline_and_the_variable_is_named(
    extra: dict[str, str], variable: str, shown: str
) -> None:
    settings = load_relay_settings({**BOOT, **extra})
    with pytest.raises(ConfigError) as raised:
        kafka.check_producer_config(settings)
    assert raised.value.name == variable and shown in str(raised.value)
    assert PASSWORD not in str(raised.value)


def test_a_wrong_key_password_is_caught_before_any_work(certificates: Certificates) -> None:
    wrong = "not-the-" + certificates.key_password
    settings = load_relay_settings({
        **BOOT, "KAFKA_SECURITY_PROTOCOL": "SSL",
        "KAFKA_SSL_CERTIFICATE_LOCATION": str(certificates.client),
        "KAFKA_SSL_KEY_LOCATION": str(certificates.client_key), "KAFKA_SSL_KEY_PASSWORD": wrong,
    })
    with pytest.raises(ConfigError) as raised:
        kafka.check_producer_config(settings)
    assert raised.value.name == "KAFKA_SSL_KEY_LOCATION"
    assert "KAFKA_SSL_KEY_PASSWORD" in str(raised.value) and wrong not in str(raised.value)


# --- against a broker -----------------------------------------------------------------------


def tls_env(bootstrap: str, certificates: Certificates, **extra: str) -> dict[str, str]:
    return relay_env(bootstrap, **{"KAFKA_SECURITY_PROTOCOL": "SSL",
                                   "KAFKA_SSL_CA_LOCATION": str(certificates.ca), **extra})


def assert_refused_in_one_line(done_stderr: str, *, expect: str) -> None:
    """Exit 1 is checked by the caller; here: one log line and the command's own line."""
    lines = [ln for ln in done_stderr.strip().splitlines() if ln]
    said = [ln for ln in lines if expect in ln]
    assert lines[-1].startswith("CommandError: kafka refused the relay"), lines[-3:]
    assert len(said) == 2, lines  # the JSON log line and the exit line, no flood
    assert len(lines) <= 4, lines
    assert PASSWORD not in done_stderr


def assert_nothing_touched() -> None:
    """No row published (the position passed none), none detoured, no attempt counted."""
    assert all(r["published_at"] is None and r["detoured_at"] is None and r["attempts"] == 0
               for r in outbox_state())


@pytest.mark.slow
def test_tls_relay_verifies_the_broker_against_the_ca_and_publishes(
    transactional_db: None, tansu_tls: TansuBroker, certificates: Certificates
) -> None:
    interleaved_rows(keys=3, per_key=2)
    env = tls_env(tansu_tls.bootstrap_servers, certificates)

    done = run_relay(env)

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Relay pass: 6 published")
    shown = run_relay_command(env, "read_outbox_topic")
    assert shown.splitlines()[0].endswith(": 6 event(s) consumed")  # the reader uses TLS too
    chaos_report.record("kafka TLS: socat in front of Tansu, CA verified", published=6,
                        read_back=6)


def run_relay_command(env: dict[str, str], *args: str) -> str:
    return subprocess.run([*manage_py(), *args], env=env, text=True, capture_output=True,
                          timeout=120, check=True).stdout


@pytest.mark.slow
def test_tls_with_the_wrong_ca_exits_4_in_one_line_and_publishes_nothing(
    transactional_db: None, tansu_tls: TansuBroker, certificates: Certificates
) -> None:
    interleaved_rows(keys=3, per_key=2)
    env = tls_env(tansu_tls.bootstrap_servers, certificates,
                  KAFKA_SSL_CA_LOCATION=str(certificates.other_ca))

    done = run_relay(env)

    assert done.returncode == 4, done.stderr
    assert_refused_in_one_line(done.stderr, expect="certificate verify failed")
    assert "KAFKA_SSL_CA_LOCATION" in done.stderr.splitlines()[-1]
    assert_nothing_touched()


@pytest.mark.slow
def test_the_broker_s_host_name_is_verified_unless_turned_off(
    transactional_db: None, tmp_path: Path, certificates: Certificates
) -> None:
    insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
    front_port = reserve_port()
    with TansuBroker(tmp_path / "tansu", advertised_port=front_port).start() as broker:
        front = TlsFront(tmp_path, broker.port, certificates.misnamed, certificates.misnamed_key,
                         port=front_port)
        try:
            env = tls_env(broker.bootstrap_servers, certificates)
            verified = run_relay(env)
            state_after_refusal = outbox_state()
            unverified = run_relay({**env, "KAFKA_SSL_ENDPOINT_IDENTIFICATION": "none"})
        finally:
            front.stop()

    assert verified.returncode == 4, verified.stderr
    assert_refused_in_one_line(verified.stderr, expect="certificate verify failed")
    assert all(r["published_at"] is None and r["attempts"] == 0 for r in state_after_refusal)
    assert unverified.returncode == 0, unverified.stderr  # same CA, name not checked
    assert unverified.stdout.startswith("Relay pass: 1 published")


@pytest.mark.slow
def test_a_broker_demanding_a_client_certificate_takes_the_relay_s_encrypted_key(
    transactional_db: None, tmp_path: Path, certificates: Certificates
) -> None:
    insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
    front_port = reserve_port()
    with TansuBroker(tmp_path / "tansu", advertised_port=front_port).start() as broker:
        front = TlsFront(tmp_path, broker.port, certificates.server, certificates.server_key,
                         client_ca=certificates.ca, port=front_port)
        try:
            env = tls_env(broker.bootstrap_servers, certificates)
            without = run_relay(env)
            state_without = outbox_state()
            with_cert = run_relay({
                **env, "OUTBOX_DELIVERY_TIMEOUT": "20s",
                "KAFKA_SSL_CERTIFICATE_LOCATION": str(certificates.client),
                "KAFKA_SSL_KEY_LOCATION": str(certificates.client_key),
                "KAFKA_SSL_KEY_PASSWORD": certificates.key_password})
        finally:
            front.stop()

    assert without.returncode == 4, without.stderr
    assert_refused_in_one_line(without.stderr, expect="certificate required")
    assert "KAFKA_SSL_CERTIFICATE_LOCATION" in without.stderr.splitlines()[-1]
    assert all(r["published_at"] is None and r["attempts"] == 0 for r in state_without)
    assert with_cert.returncode == 0, with_cert.stderr
    assert certificates.key_password not in with_cert.stderr + without.stderr
    chaos_report.record("kafka mutual TLS: socat demands a client certificate",
                        without_certificate_exit=without.returncode,
                        with_encrypted_key_exit=with_cert.returncode)


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_sasl_credentials_refused_by_a_broker_that_demands_them_exit_4_in_one_line(
    transactional_db: None, tmp_path: Path, mechanism: str
) -> None:
    interleaved_rows(keys=3, per_key=2)
    with TansuBroker(tmp_path / "tansu", authentication=True).start() as broker:
        # PLAIN in clear text is taken only when named, for a broker on loopback (as Tansu is).
        allow = {"KAFKA_SASL_PLAINTEXT_ALLOW": "PLAIN"} if mechanism == "PLAIN" else {}
        done = run_relay(relay_env(broker.bootstrap_servers, **sasl("SASL_PLAINTEXT", mechanism),
                                   **allow))

    assert done.returncode == 4, done.stderr
    assert_refused_in_one_line(done.stderr, expect="_AUTHENTICATION")
    assert "KAFKA_SASL_PASSWORD" in done.stderr.splitlines()[-1]
    assert_nothing_touched()
    chaos_report.count("kafka SASL refused by Tansu --authentication", runs=1, exit_4=1,
                       rows_touched=0)


@pytest.mark.slow
def test_sasl_ssl_refused_behind_tls_and_a_looping_relay_stops_too(
    transactional_db: None, tmp_path: Path, certificates: Certificates
) -> None:
    # Through the TLS front (the CA verified), then SCRAM refused by the broker behind it.
    front_port = reserve_port()
    log = tmp_path / "relay.log"
    with TansuBroker(tmp_path / "tansu", advertised_port=front_port,
                     authentication=True).start() as broker:
        front = TlsFront(tmp_path, broker.port, certificates.server, certificates.server_key,
                         port=front_port)
        try:
            env = tls_env(broker.bootstrap_servers, certificates, **sasl("SASL_SSL"))
            relay = start_relay(env, "--loop", log=log)  # nothing to publish: refused anyway
            relay.communicate(timeout=60)
        finally:
            front.stop()

    assert relay.returncode == 4, log.read_text()
    assert_refused_in_one_line(log.read_text(), expect="unknown-user")
    assert outbox_state() == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "variable"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CA_LOCATION": "/nonexistent/ca.pem"},
         "KAFKA_SSL_CA_LOCATION"),
        ({"KAFKA_PRODUCER_CONFIG": '{"enable.idempotence": false}'}, "KAFKA_PRODUCER_CONFIG"),
        ({"KAFKA_PRODUCER_CONFIG": '{"message.timeout.ms": 600000}'}, "KAFKA_PRODUCER_CONFIG"),
        ({**sasl(), "KAFKA_SASL_MECHANISM": "OAUTHBEARER"}, "KAFKA_SASL_MECHANISM"),
    ],
)
def test_the_command_exits_2_in_one_line_naming_the_variable(
    transactional_db: None, extra: dict[str, str], variable: str
) -> None:
    insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)

    done = run_relay(relay_env("127.0.0.1:9092", **extra))

    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and variable in lines[0] and PASSWORD not in lines[0]
    assert_nothing_touched()
