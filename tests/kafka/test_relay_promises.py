"""Every promise of the relay again, on Apache Kafka itself: three brokers, each test's topic
as production's should be (6 partitions, replication factor 3, min.insync.replicas=2, unclean
leader election off). No OUTBOX_ALLOW_UNDURABLE_TOPIC here: the stand-ins need it, a durable
topic does not. The same promises on the mock cluster and on Tansu: tests/integration/
test_relay.py, test_relay_tansu.py, test_relay_topic.py, test_cloudevents.py, test_audit.py
and tests/acceptance/test_relay_process.py."""

import json
import logging
import signal
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource
from django.db import connection

from devtools.kafka_cluster import KafkaCluster
from devtools.read_topic import Record, read_topic
from outbox.config import ALLOW_UNDURABLE_VAR, RelaySettings
from outbox.relay import Relay
from tests.acceptance.test_relay_process import relay_env, run_relay, start_relay
from tests.integration.test_audit import audit_command, loop_cycle, some_documents
from tests.integration.test_cloudevents import assert_cloudevent
from tests.integration.test_relay_topic import said
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner
from tests.support.factories import Documents
from tests.support.kafka_support import (
    PARTITIONS,
    TopicMaker,
    broker_default,
    rows_sent_to,
    topic_reader,
)
from tests.support.ledger import AS_OF
from tests.support.partitioner import partition_of
from tests.support.relay_support import (
    BASE_TIME,
    as_relay,
    assert_sent_as_stored,
    first_seen_order,
    insert_outbox,
    interleaved_rows,
    outbox_state,
    relay_settings,
    standby_takeover,
    stored_rows,
    unpublished_count,
    wait_for,
    written_order,
)

MIN_INSYNC = "min.insync.replicas"
UNCLEAN = "unclean.leader.election.enable"


def durable_relay_env(cluster: KafkaCluster, topic: str, **extra: str) -> dict[str, str]:
    """publish_outbox's environment for the real cluster: the stand-ins' switch left unset, the
    test's `topic` the one the relay may publish to."""
    env = relay_env(cluster.bootstrap_servers, OUTBOX_TOPICS=topic, **extra)
    del env[ALLOW_UNDURABLE_VAR]
    return env


def assert_one_partition_per_owner(records: list[Record]) -> None:
    """Each owner's records on the partition the Java client's murmur2 gives it, and more
    than one partition used."""
    placed = {(r.key, r.partition) for r in records}
    assert placed == {(r.key, partition_of(r.key, PARTITIONS)) for r in records}
    assert len({p for _, p in placed}) > 1


def test_the_contract_round_trip_with_default_settings_and_a_verified_topic(
    run: CycleRunner, documents: Documents, kafka_cluster: KafkaCluster, real_topic: TopicMaker,
    caplog: pytest.LogCaptureFixture
) -> None:
    topic = real_topic()
    some_documents(documents)  # five owners due, one of them with two documents
    run(AS_OF)
    rows = stored_rows()
    assert len(rows) == 5
    # The settings' defaults, the bootstrap servers and the test's topic aside: the durability
    # check on, no switch.
    settings = RelaySettings(bootstrap_servers=kafka_cluster.bootstrap_servers,
                             topics=frozenset({topic}))

    with rows_sent_to(topic), as_relay(), caplog.at_level(logging.INFO, logger="outbox.relay"):
        stats = Relay(settings).run_pass()

    assert (stats.published, stats.failed, stats.released) == (5, 0, 0)
    [verified] = said(caplog, "topic keeps what it acknowledges")
    assert (verified["topic"], verified["replicas"], verified["min_insync_replicas"],
            verified["unclean_leader_election"]) == (topic, 3, 2, False)
    records = read_topic(kafka_cluster.bootstrap_servers, topic)
    assert sorted(r.message_id for r in records) == sorted(rows)
    for record in records:
        row = rows[record.message_id]
        assert_sent_as_stored(record, row)
        assert_cloudevent(record, row.id, row.created_at)
    assert_one_partition_per_owner(records)
    assert_outbox_matches_contract()


def test_order_per_owner_with_two_relays_and_a_takeover(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker
) -> None:
    topic = real_topic()
    settings = relay_settings(kafka_cluster.bootstrap_servers, batch_size=7,
                              allow_undurable_topic=False, topics=frozenset({topic}))

    written = standby_takeover(settings, topic=topic)

    records = read_topic(kafka_cluster.bootstrap_servers, topic)
    assert first_seen_order(records) == written_order(written)
    copies = Counter(r.message_id for r in records)
    assert len(copies) == 240 and max(copies.values()) <= 2  # at least once, at most twice
    assert_one_partition_per_owner(records)


@pytest.mark.slow
def test_the_audit_is_clean_against_the_real_topic(
    run: CycleRunner, documents: Documents, kafka_cluster: KafkaCluster, real_topic: TopicMaker
) -> None:
    """The audit command reads the topic over SASL_SSL as a user that sees this test's topic
    alone: the contract's topic, which it reads too, may hold other tests' records."""
    topic = real_topic()
    some_documents(documents)
    loop_cycle(run)

    with rows_sent_to(topic):
        with as_relay():
            settings = relay_settings(kafka_cluster.bootstrap_servers, allow_undurable_topic=False,
                                      topics=frozenset({topic}))
            assert Relay(settings).run_pass().published == 5
        with topic_reader(kafka_cluster, topic) as kafka_env:
            done = audit_command("--against-topic", "--format", "json", OUTBOX_TOPICS=topic,
                                 **kafka_env)

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["findings"], report["not_checked"]) == (0, []), report
    assert {c["name"]: c["status"] for c in report["checks"]} == {
        c["name"]: "clean" for c in report["checks"]}
    [checked] = [c for c in report["checks"] if c["name"] == "topic"]
    assert checked["examined"] == {"published_events": 5, "records": 5, "partitions": PARTITIONS}
    assert_outbox_matches_contract()


@pytest.mark.slow
def test_the_audit_lists_a_row_off_the_allowlist_and_reads_the_relay_s_topics_only(
    run: CycleRunner, documents: Documents, kafka_cluster: KafkaCluster, real_topic: TopicMaker
) -> None:
    """A row naming a topic OUTBOX_TOPICS does not, parked by the relay: the audit lists it
    (`parked_off_allowlist`, with its topic) and reconciles the relay's topic alone. Its user
    may not describe the other topic, which it would take for a refusal (exit 4) had it
    followed the row there."""
    topic, other = real_topic(), real_topic()
    some_documents(documents)
    loop_cycle(run)

    with rows_sent_to(topic):
        foreign = insert_outbox("owner-writing-elsewhere", created_at=datetime.now(UTC),
                                topic=other, payload={"ownerUserId": "owner-writing-elsewhere"})
        with as_relay():
            settings = relay_settings(kafka_cluster.bootstrap_servers, allow_undurable_topic=False,
                                      topics=frozenset({topic}))
            stats = Relay(settings).run_pass()
        with topic_reader(kafka_cluster, topic) as kafka_env:
            done = audit_command("--against-topic", "--format", "json", OUTBOX_TOPICS=topic,
                                 **kafka_env)
    with connection.cursor() as cursor:  # the operator's way with it (and no contract event)
        cursor.execute("delete from outbox_messages where id = %s", [foreign.id])

    assert (stats.published, stats.parked) == (5, 1)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["findings"] == 1, report
    [parked] = [c for c in report["checks"] if c["name"] == "parked"]
    assert [(f["code"], f["count"]) for f in parked["findings"]] == [("parked_off_allowlist", 1)]
    assert [(i["event"], i["topic"]) for i in parked["findings"][0]["ids"]] == [
        (str(foreign.id), other)]
    [checked] = [c for c in report["checks"] if c["name"] == "topic"]
    assert checked["status"] == "clean"
    assert checked["examined"] == {"published_events": 5, "records": 5, "partitions": PARTITIONS}
    assert read_topic(kafka_cluster.bootstrap_servers, other, timeout=30) == []
    assert_outbox_matches_contract()


@pytest.mark.slow
def test_a_one_shot_pass_publishes_everything_and_exits_0(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker
) -> None:
    topic = real_topic()
    written = interleaved_rows(keys=10, per_key=3, topic=topic)

    done = run_relay(durable_relay_env(kafka_cluster, topic))

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Relay pass: 30 published"), done.stdout
    assert '"topic keeps what it acknowledges"' in done.stderr
    assert unpublished_count() == 0
    records = read_topic(kafka_cluster.bootstrap_servers, topic)
    assert first_seen_order(records) == written_order(written)
    assert len(records) == 30


@pytest.mark.slow
def test_the_loop_publishes_what_is_written_while_it_runs_and_stops_on_sigterm(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker, tmp_path: Path
) -> None:
    topic = real_topic()
    log = tmp_path / "relay.log"
    before = interleaved_rows(keys=10, per_key=2, topic=topic)
    relay = start_relay(durable_relay_env(kafka_cluster, topic), "--loop", log=log)

    def published_or_exited() -> bool:
        return relay.poll() is not None or unpublished_count() == 0

    try:
        wait_for(published_or_exited, timeout=60, what="the first rows published")
        after = interleaved_rows(keys=10, per_key=2, topic=topic)  # woken by the notification
        wait_for(published_or_exited, timeout=60, what="the later rows published")
        assert relay.poll() is None, "the relay exited"
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.communicate(timeout=60)

    assert relay.returncode == 0, log.read_text()[-3000:]
    lines = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith('{"ts"')]
    [stopped] = [e for e in lines if e["event"] == "relay stopped"]
    assert int(stopped["published"]) == 40
    assert [e["topic"] for e in lines if e["event"] == "topic keeps what it acknowledges"] == [topic]
    records = read_topic(kafka_cluster.bootstrap_servers, topic)
    assert first_seen_order(records) == written_order({**before, **after})


def test_a_row_naming_a_topic_off_the_allowlist_is_parked_and_nothing_reaches_that_topic(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker
) -> None:
    """OUTBOX_TOPICS on Apache Kafka itself: the relay's principal may write both topics (the
    plaintext listener's super user), and a row names the one OUTBOX_TOPICS does not: the pass
    parks it (exit 4, one line), publishes every other owner's rows, holds the row behind it,
    and the other topic stays empty."""
    topic, other = real_topic(), real_topic()
    key = str(uuid.uuid4())
    written = interleaved_rows(keys=5, per_key=2, topic=topic)
    foreign = insert_outbox(key, created_at=BASE_TIME + timedelta(seconds=1), topic=other)
    behind = insert_outbox(key, created_at=BASE_TIME + timedelta(seconds=2), seq=1, topic=topic)

    done = run_relay(durable_relay_env(kafka_cluster, topic))

    assert done.returncode == 4, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(
        "0 failed, 1 parked: a parked message waits for an operator (manage.py requeue_outbox)")
    [parked] = [json.loads(ln) for ln in done.stderr.splitlines() if ln.startswith('{"ts"')
                and json.loads(ln)["event"] == "message parked, its topic is not on OUTBOX_TOPICS"]
    assert (parked["message_id"], parked["topic"]) == (str(foreign.id), other)
    state = {r["id"]: r for r in outbox_state()}
    assert state[foreign.id]["parked_at"] is not None and state[foreign.id]["attempts"] == 0
    assert state[foreign.id]["last_error"] == (
        f"topic {other!r} is not on OUTBOX_TOPICS ({topic}): never sent, parked")
    assert state[behind.id]["published_at"] is None  # behind the parked row, as order wants
    assert read_topic(kafka_cluster.bootstrap_servers, other, timeout=30) == []
    records = read_topic(kafka_cluster.bootstrap_servers, topic)
    assert first_seen_order(records) == written_order(written)
    assert len(records) == 10


# --- the durability check reads the real DescribeConfigs ----------------------------------

DURABILITY_CASES = {
    # topic -> (the topic's own settings, a cluster-wide broker default, what the relay says)
    "min.insync.replicas=1 on the topic": (
        {MIN_INSYNC: "1"}, None, f"{MIN_INSYNC}=1 (replicas: 3)"),
    "min.insync.replicas=1 inherited from the brokers' default": (
        {MIN_INSYNC: None}, "1", f"{MIN_INSYNC}=1 (replicas: 3)"),
    "unclean leader election on": ({UNCLEAN: "true"}, None, f"{UNCLEAN}=true"),
    "min.insync.replicas=2": ({}, None, None),
}


def topic_setting(cluster: KafkaCluster, topic: str, name: str) -> tuple[str | None, int]:
    """`name` as DescribeConfigs reports it for `topic`: its value and its source."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = AdminClient(cluster.client_config())
    entry = admin.describe_configs([resource])[resource].result(timeout=30)[name]
    return entry.value, int(entry.source)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DURABILITY_CASES))
def test_the_durability_check_reads_the_real_configuration(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker, case: str
) -> None:
    config, default, refusal = DURABILITY_CASES[case]
    topic = real_topic(config=config)
    interleaved_rows(keys=5, per_key=1, topic=topic)

    if default is None:
        done = run_relay(durable_relay_env(kafka_cluster, topic))
    else:
        with broker_default(kafka_cluster, MIN_INSYNC, default):
            # The topic has no setting of its own: DescribeConfigs reports the default.
            assert topic_setting(kafka_cluster, topic, MIN_INSYNC) == (
                default, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
            done = run_relay(durable_relay_env(kafka_cluster, topic))

    if refusal is None:
        assert done.returncode == 0, done.stderr
        assert unpublished_count() == 0
        assert len(read_topic(kafka_cluster.bootstrap_servers, topic)) == 5
        return
    assert done.returncode == 4, done.stderr
    said_lines = [ln for ln in done.stderr.strip().splitlines() if not ln.startswith('{"ts"')]
    assert len(said_lines) == 1, done.stderr
    assert said_lines[0].startswith(
        f"CommandError: bad configuration: topic {topic}: {refusal}"), said_lines
    assert "--add-config" in said_lines[0]
    assert unpublished_count() == 5
    assert read_topic(kafka_cluster.bootstrap_servers, topic, timeout=10) == []
