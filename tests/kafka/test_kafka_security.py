"""Security on Apache Kafka itself (docs/operations.md, "Kafka ACLs"; docs/outbox-relay.md, "A
secured Kafka"): the relay logs in over SASL_SSL (SCRAM-SHA-512, the brokers' certificate
verified against the cluster's CA) and publishes; a wrong password is refused in one line, with
nothing recorded and no secret shown. The ACLs are docs/operations.md's own kafka-acls.sh
commands, run as written (a fresh principal and topic put in): they are enough for the relay
and for the audit, and each one taken away shows as the page says.

Each test logs in as a SCRAM user of its own on the shared cluster and removes its ACLs and its
user at the end."""

import argparse
import json
import secrets
import shlex
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from core.roles import AUDITOR_ROLE
from devtools.kafka_cluster import ROOT, SCRAM, KafkaCluster
from devtools.read_topic import read_topic
from reminders import events
from tests.acceptance.test_relay_process import relay_env, run_relay
from tests.support.exported_metrics import scrape_process
from tests.support.kafka_support import TopicMaker, every_acl_of, scram_user
from tests.support.processes import command_env, run_command
from tests.support.relay_support import insert_outbox, outbox_state, unpublished_count, wait_for

pytestmark = pytest.mark.slow

OPERATIONS_DOC = ROOT / "docs" / "operations.md"
ACL_TOOL = "org.apache.kafka.tools.AclCommand"  # what kafka-acls.sh runs
RELAY, AUDIT = "pin_outbox_relay", "pin_outbox_audit"  # the principals the page names
ROWS = 6


# --- the page's ACLs -------------------------------------------------------------------------


def documented_commands(principal: str) -> list[list[str]]:
    """The arguments of each kafka-acls.sh command docs/operations.md ("Kafka ACLs") gives for
    User:`principal`."""
    section = OPERATIONS_DOC.read_text().split("\n## Kafka ACLs\n", 1)[1].split("\n## ", 1)[0]
    lines = section.replace("\\\n", " ").splitlines()
    commands = [shlex.split(line)[1:] for line in lines if line.strip().startswith("kafka-acls.sh")]
    return [c for c in commands if f"User:{principal}" in c]


_ACL_ARGUMENTS = argparse.ArgumentParser(exit_on_error=False, add_help=False)
for _flag in ("--bootstrap-server", "--command-config", "--allow-principal", "--topic", "--group",
              "--resource-pattern-type"):
    _ACL_ARGUMENTS.add_argument(_flag)
_ACL_ARGUMENTS.add_argument("--add", action="store_true")
_ACL_ARGUMENTS.add_argument("--operation", action="append", default=[])


def bindings(command: list[str]) -> set[AclBinding]:
    """What one kafka-acls.sh --add command grants (only the options the page uses: another
    fails here, so the page stays within what this reading understands)."""
    args = _ACL_ARGUMENTS.parse_args(command)
    assert args.add and args.allow_principal
    pattern = ResourcePatternType[(args.resource_pattern_type or "literal").upper()]
    resources = [(ResourceType.TOPIC, args.topic), (ResourceType.GROUP, args.group)]
    operation = {"Write": AclOperation.WRITE, "Read": AclOperation.READ,
                 "Describe": AclOperation.DESCRIBE,
                 "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS}
    return {AclBinding(kind, name, pattern, args.allow_principal, "*", operation[op],
                       AclPermissionType.ALLOW)
            for kind, name in resources if name for op in args.operation}


@dataclass(frozen=True)
class Principal:
    """A SCRAM user of one test; `commands` gives it the ACLs the page gives one it names."""

    name: str
    password: str

    def commands(self, stands_for: str, topic: str, **put: str) -> list[list[str]]:
        """The page's commands for `stands_for`, for this principal and `topic` (and each
        argument in `put` replaced by its value)."""
        put = {**put, f"User:{stands_for}": f"User:{self.name}", events.TOPIC: topic}
        return [[put.get(arg, arg) for arg in command]
                for command in documented_commands(stands_for)]


@pytest.fixture
def principal(kafka_cluster: KafkaCluster) -> Iterator[Principal]:
    """A fresh SCRAM-SHA-512 user (`scram_user`); its ACLs and the user removed at the end."""
    with scram_user(kafka_cluster) as user:
        yield Principal(user.name, user.password)


def acls_of(admin: AdminClient, who: Principal) -> set[AclBinding]:
    return set(admin.describe_acls(every_acl_of(who.name)).result(timeout=30))


def grant(cluster: KafkaCluster, who: Principal, acls: set[AclBinding]) -> None:
    """Create `acls` (the super user, through the admin API); returns once the cluster lists
    them (the brokers' authorizers follow the metadata log)."""
    admin = AdminClient(cluster.client_config())
    for future in admin.create_acls(list(acls)).values():
        future.result(timeout=30)
    wait_for(lambda: acls_of(admin, who) == acls, timeout=30, what=f"{who.name}'s ACLs")


def grant_as_documented(cluster: KafkaCluster, who: Principal, stands_for: str, topic: str,
                        tmp_path: Path) -> set[AclBinding]:
    """Run the page's kafka-acls.sh commands for `stands_for` (Kafka's own AclCommand, as a
    super user over SASL_SSL) for `who` and `topic`: what they granted, which is exactly what
    the page's commands say."""
    properties = tmp_path / "admin.properties"
    properties.write_text(
        f"security.protocol=SASL_SSL\nsasl.mechanism={SCRAM}\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="admin" password="{cluster.passwords["admin"]}";\n'
        f"ssl.truststore.type=PEM\nssl.truststore.location={cluster.ca_location}\n")
    commands = who.commands(stands_for, topic, **{
        "$KAFKA": cluster.sasl_ssl_bootstrap_servers, "admin.properties": str(properties)})
    assert commands, f"docs/operations.md gives no kafka-acls.sh command for User:{stands_for}"
    for command in commands:
        done = cluster.java(ACL_TOOL, *command)
        assert done.returncode == 0, done.stdout + done.stderr
    expected = set().union(*(bindings(c) for c in commands))
    admin = AdminClient(cluster.client_config())
    wait_for(lambda: acls_of(admin, who) == expected, timeout=30, what=f"{who.name}'s ACLs")
    return expected


def documented_acls(who: Principal, stands_for: str, topic: str) -> set[AclBinding]:
    """The page's ACLs for `stands_for`, as bindings for `who` and `topic`."""
    return set().union(*(bindings(c) for c in who.commands(stands_for, topic)))


def without(acls: set[AclBinding], operation: AclOperation) -> set[AclBinding]:
    assert any(a.operation == operation for a in acls), f"the page grants no {operation.name}"
    return {a for a in acls if a.operation != operation}


# --- the relay ------------------------------------------------------------------------------


def sasl_env(cluster: KafkaCluster, who: Principal, topic: str, **extra: str) -> dict[str, str]:
    """The relay's environment for SASL_SSL as `who`, through the documented variables, the
    test's `topic` the one it may publish to."""
    env = relay_env(cluster.sasl_ssl_bootstrap_servers, OUTBOX_TOPICS=topic, **{
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": SCRAM,
        "KAFKA_SASL_USERNAME": who.name, "KAFKA_SASL_PASSWORD": who.password,
        "KAFKA_SSL_CA_LOCATION": str(cluster.ca_location), "OUTBOX_DELIVERY_TIMEOUT": "15s",
        **extra})
    del env["OUTBOX_ALLOW_UNDURABLE_TOPIC"]  # a real, durable topic: the check passes on its own
    return env


def write_rows(topic: str, *, at: datetime | None = None) -> list[str]:
    """ROWS events for `topic`, one owner each; their message ids."""
    start = at or datetime.now(UTC) - timedelta(minutes=1)
    return [str(insert_outbox(str(uuid.uuid4()), created_at=start + timedelta(milliseconds=i),
                              topic=topic, seq=i).id) for i in range(ROWS)]


def log_events(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def assert_untouched() -> None:
    """Nothing recorded as published, no attempt counted, nothing detoured or parked."""
    rows = outbox_state()
    assert len(rows) == ROWS
    assert all(r["published_at"] is None and r["detoured_at"] is None and r["attempts"] == 0
               and r["parked_at"] is None for r in rows), rows


def assert_refused_in_one_line(stderr: str, *, naming: str) -> str:
    """Exit 1 is the caller's: here the relay's one error line and the command's own last line
    (which the return is), both naming the problem, and nothing else said of it."""
    lines = [line for line in stderr.strip().splitlines() if line]
    assert lines[-1].startswith("CommandError: kafka refused the relay (SASL_SSL SCRAM-SHA-512)"), lines
    errors = [e for e in log_events(stderr) if e["level"] in {"error", "critical"}]
    assert [e["event"] for e in errors] == ["kafka refused the relay"], lines
    assert naming in str(errors[0]["error"]) and naming in lines[-1]
    assert len(lines) <= 3, lines  # "relay leading" at most, the log line, the exit line
    return lines[-1]


def test_the_relay_logs_in_over_sasl_ssl_and_publishes_with_exactly_the_documented_acls(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker,
    principal: Principal, tmp_path: Path,
) -> None:
    topic = real_topic()
    granted = grant_as_documented(kafka_cluster, principal, RELAY, topic, tmp_path)
    written = write_rows(topic)

    done = run_relay(sasl_env(kafka_cluster, principal, topic))

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Relay pass: {ROWS} published"), done.stdout
    said = {e["event"]: e for e in log_events(done.stderr)}
    # DescribeConfigs granted: the durability check read the real configuration.
    assert said["topic keeps what it acknowledges"]["min_insync_replicas"] == 2, done.stderr
    assert "topic durability unverified" not in said
    assert unpublished_count() == 0
    assert {r.message_id for r in read_topic(kafka_cluster.bootstrap_servers, topic)} == set(
        written)
    assert principal.password not in done.stdout + done.stderr
    assert {(a.restype, a.operation) for a in granted} == {
        (ResourceType.TOPIC, AclOperation.WRITE), (ResourceType.TOPIC, AclOperation.DESCRIBE_CONFIGS)}


def test_a_wrong_password_is_refused_in_one_line_nothing_recorded_and_no_secret_shown(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker,
    principal: Principal,
) -> None:
    topic = real_topic()
    grant(kafka_cluster, principal, documented_acls(principal, RELAY, topic))
    write_rows(topic)
    wrong = f"wrong-{secrets.token_urlsafe(12)}"
    env = sasl_env(kafka_cluster, principal, topic, KAFKA_SASL_PASSWORD=wrong,
                   OUTBOX_DELIVERY_TIMEOUT="30s")  # the default

    started = time.monotonic()
    done = run_relay(env)
    took_s = time.monotonic() - started
    # librdkafka's own SASL and security lines too, at the relay's most verbose
    verbose = run_relay({**env, "LOG_LEVEL": "DEBUG",
                         "KAFKA_PRODUCER_CONFIG": '{"debug": "security,broker,protocol"}'})

    assert done.returncode == 4, done.stderr
    line = assert_refused_in_one_line(done.stderr, naming="_AUTHENTICATION")
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in line
    assert line.endswith("check KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD")
    assert done.stdout == ""
    assert took_s < 15, "the refusal waited for the delivery timeout"  # about 1 s when idle
    assert verbose.returncode == 4, verbose.stderr
    assert len(verbose.stderr.splitlines()) > 20  # librdkafka's debug lines were there to read
    for shown in (done.stdout, done.stderr, verbose.stdout, verbose.stderr):
        assert wrong not in shown and principal.password not in shown
    assert_untouched()


def test_a_principal_without_write_is_refused_in_one_line_and_nothing_recorded(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker,
    principal: Principal,
) -> None:
    topic = real_topic()
    grant(kafka_cluster, principal,
          without(documented_acls(principal, RELAY, topic), AclOperation.WRITE))
    write_rows(topic)

    done = run_relay(sasl_env(kafka_cluster, principal, topic))

    # Its producer id refused (CLUSTER_AUTHORIZATION_FAILED), or, where the broker grants one
    # all the same, each record (TOPIC_AUTHORIZATION_FAILED): a refusal either way.
    assert done.returncode == 4, done.stderr
    line = assert_refused_in_one_line(done.stderr, naming="_AUTHORIZATION_FAILED")
    assert f"check the ACLs of User:{principal.name}: Write and DescribeConfigs" in line
    assert_untouched()


def test_a_principal_without_describe_configs_publishes_with_durability_unverified(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker,
    principal: Principal, tmp_path: Path,
) -> None:
    topic = real_topic()
    grant(kafka_cluster, principal,
          without(documented_acls(principal, RELAY, topic), AclOperation.DESCRIBE_CONFIGS))
    write_rows(topic)
    log = tmp_path / "relay.log"
    unverified = f'profile_outbox_topic_durability{{state="unverified",topic="{topic}"}} 1.0'

    scraped = scrape_process(["publish_outbox", "--loop"], sasl_env(kafka_cluster, principal, topic),
                             log, lambda text, _log: unverified in text
                             and unpublished_count() == 0)

    assert f'profile_outbox_topic_durability{{state="verified",topic="{topic}"}} 0.0' in scraped
    said = [e for e in log_events(log.read_text())
            if e["event"] == "topic durability unverified"]
    assert len(said) == 1, log.read_text()
    assert said[0]["level"] == "warning" and said[0]["topic"] == topic
    assert said[0]["reason"] == ("not allowed to describe the topic's configuration "
                                 "(DescribeConfigs)")
    assert len(read_topic(kafka_cluster.bootstrap_servers, topic)) == ROWS


# --- the audit ------------------------------------------------------------------------------


def audit_env(cluster: KafkaCluster, who: Principal, topic: str) -> dict[str, str]:
    return command_env(AUDITOR_ROLE, OUTBOX_TOPICS=topic,
                       KAFKA_BOOTSTRAP_SERVERS=cluster.sasl_ssl_bootstrap_servers,
                       KAFKA_SECURITY_PROTOCOL="SASL_SSL", KAFKA_SASL_MECHANISM=SCRAM,
                       KAFKA_SASL_USERNAME=who.name, KAFKA_SASL_PASSWORD=who.password,
                       KAFKA_SSL_CA_LOCATION=str(cluster.ca_location))


def run_audit(cluster: KafkaCluster, who: Principal, topic: str,
              at: datetime) -> tuple[int, str, str]:
    """`audit_reminders --against-topic` over two minutes around `at`, as `who`, `topic` the
    relay's (OUTBOX_TOPICS)."""
    done = run_command("audit_reminders", "--against-topic", "--format", "json",
                       "--as-of", (at + timedelta(minutes=1)).isoformat(), "--since", "2m",
                       "--kafka-timeout", "30s", env=audit_env(cluster, who, topic), timeout=120)
    return done.returncode, done.stdout, done.stderr


def published_window(cluster: KafkaCluster, topic: str) -> datetime:
    """ROWS events published to `topic` by the relay (the plaintext listener's super user) at
    an instant of this test alone, two days ago: no other test's record is in its window."""
    at = (datetime.now(UTC) - timedelta(days=2, minutes=secrets.randbelow(600))).replace(
        microsecond=0)
    write_rows(topic, at=at)
    done = run_relay({**relay_env(cluster.bootstrap_servers),
                      "OUTBOX_ALLOW_UNDURABLE_TOPIC": "off", "OUTBOX_TOPICS": topic})
    assert done.returncode == 0, done.stderr
    return at


def grant_the_reminders_topic(cluster: KafkaCluster, who: Principal,
                              acls: set[AclBinding]) -> None:
    """`acls` (the audit's, for the test's topic) added for the reminders' own topic too: the
    audit reads that one as well, for records the table does not know."""
    grant(cluster, who, acls | {AclBinding(a.restype, events.TOPIC, a.resource_pattern_type,
                                           a.principal, a.host, a.operation, a.permission_type)
                                for a in acls if a.restype == ResourceType.TOPIC})


def test_the_audit_reads_the_topic_with_exactly_the_documented_acls(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker,
    principal: Principal, tmp_path: Path,
) -> None:
    topic = real_topic()
    at = published_window(kafka_cluster, topic)
    granted = grant_as_documented(kafka_cluster, principal, AUDIT, topic, tmp_path)
    grant_the_reminders_topic(kafka_cluster, principal, granted)

    code, out, err = run_audit(kafka_cluster, principal, topic, at)

    # The hand-made events have no ledger behind them and waited two days: the database's
    # checks say so (exit 1). The topic's is this test's.
    assert code in {0, 1}, out + err
    [checked] = [c for c in json.loads(out)["checks"] if c["name"] == "topic"]
    assert checked["status"] == "clean", out
    assert checked["examined"]["records"] == ROWS
    assert principal.password not in out + err
    assert {(a.restype, a.operation, a.resource_pattern_type) for a in granted} == {
        (ResourceType.TOPIC, AclOperation.READ, ResourcePatternType.LITERAL),
        (ResourceType.GROUP, AclOperation.DESCRIBE, ResourcePatternType.PREFIXED)}


@pytest.mark.parametrize("taken", [
    pytest.param((AclOperation.READ, "Broker: Topic authorization failed"), id="no-read-on-topic"),
    pytest.param((AclOperation.DESCRIBE, "Group authorization failed"), id="no-describe-on-group"),
])
def test_the_audit_without_one_of_its_documented_acls_is_refused_in_one_line(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker,
    principal: Principal, taken: tuple[AclOperation, str],
) -> None:
    operation, naming = taken
    topic = real_topic()
    at = published_window(kafka_cluster, topic)
    grant_the_reminders_topic(kafka_cluster, principal,
                              without(documented_acls(principal, AUDIT, topic), operation))

    code, out, err = run_audit(kafka_cluster, principal, topic, at)

    # Not an empty topic (every event "missing"), not "unavailable" (exit 3): refused, exit 4.
    assert code == 4, out + err
    assert out == ""
    [line] = err.strip().splitlines()
    assert line.startswith("CommandError: audit failed: kafka refused the audit (SASL_SSL): ")
    assert naming in line
    assert line.endswith(f"check the ACLs of User:{principal.name}: Read on the topic, Describe "
                         "on the groups prefixed audit-reminders- "
                         '(docs/operations.md, "Kafka ACLs")')
    assert principal.password not in err
