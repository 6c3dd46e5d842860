"""The Java client agrees with the relay, on Apache Kafka itself: Kafka's own console producer
puts every owner on the partition the relay put the owner's events on (the relay's producer:
librdkafka's `murmur2_random`, outbox/kafka.py), and Kafka's own console consumer reads the
relay's events with every header. One run of each tool: a JVM's start costs seconds."""

import json
from collections.abc import Iterator

import pytest

from devtools.kafka_cluster import KafkaCluster
from devtools.read_topic import read_topic
from outbox.relay import Relay
from reminders import events
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner
from tests.support.factories import Documents
from tests.support.kafka_support import PARTITIONS, TopicMaker, rows_sent_to
from tests.support.ledger import AS_OF, expiring_in
from tests.support.partitioner import partition_of
from tests.support.relay_support import as_relay, bulk_rows, relay_settings, stored_rows

pytestmark = pytest.mark.slow

OWNERS = 3000
# What the console producer writes: `owner<TAB>value` a line, the owner its record's key.
KEY_SEPARATOR = "\t"
JAVA_VALUE = b"java"


def test_the_java_producer_puts_every_owner_on_the_partition_the_relay_chose(
    transactional_db: None, kafka_cluster: KafkaCluster, real_topic: TopicMaker
) -> None:
    topic = real_topic()
    owners = list(bulk_rows(keys=OWNERS, per_key=1, topic=topic))
    settings = relay_settings(kafka_cluster.bootstrap_servers, allow_undurable_topic=False,
                              topics=frozenset({topic}))
    with as_relay():
        assert Relay(settings).run_pass().published == OWNERS

    produced = kafka_cluster.java(
        "org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server",
        kafka_cluster.bootstrap_servers, "--topic", topic,
        "--reader-property", "parse.key=true",
        "--reader-property", f"key.separator={KEY_SEPARATOR}",
        input_text="".join(f"{owner}{KEY_SEPARATOR}{JAVA_VALUE.decode()}\n" for owner in owners))

    assert produced.returncode == 0, produced.stderr
    records = read_topic(kafka_cluster.bootstrap_servers, topic, timeout=60)
    by_relay = {r.key: r.partition for r in records if "message_id" in r.headers}
    by_java = {r.key: r.partition for r in records if r.value == JAVA_VALUE}
    assert set(by_relay) == set(by_java) == set(owners)
    elsewhere = sorted(o for o in owners if by_relay[o] != by_java[o])
    assert not elsewhere, f"{len(elsewhere)} of {OWNERS} owners on another partition, e.g. " \
                          f"{elsewhere[0]}: relay {by_relay[elsewhere[0]]}, Java {by_java[elsewhere[0]]}"
    # outbox.topic_watch's own murmur2 (the relay defers rows by it) is the Java client's too.
    assert by_java == {o: partition_of(o, PARTITIONS) for o in owners}
    assert set(by_java.values()) == set(range(PARTITIONS))


def printed_records(stdout: str) -> Iterator[tuple[dict[str, str], str, str]]:
    """The console consumer's lines (print.headers, print.key): `name:value,...<TAB>key<TAB>
    value`, as (headers, key, value)."""
    for line in stdout.splitlines():
        headers, key, value = line.split("\t", 2)
        yield dict(h.split(":", 1) for h in headers.split(",")), key, value


def test_the_java_console_consumer_reads_the_relay_s_events_with_every_header(
    run: CycleRunner, documents: Documents, kafka_cluster: KafkaCluster, real_topic: TopicMaker
) -> None:
    topic = real_topic()
    for days in (29, 6, 0, -2):
        documents(expires_at=expiring_in(days))
    run(AS_OF)
    rows = stored_rows()
    settings = relay_settings(kafka_cluster.bootstrap_servers, allow_undurable_topic=False,
                              topics=frozenset({topic}))
    with rows_sent_to(topic), as_relay():
        assert Relay(settings).run_pass().published == len(rows) == 4

    consumed = kafka_cluster.java(
        "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
        kafka_cluster.bootstrap_servers, "--topic", topic, "--from-beginning",
        "--max-messages", str(len(rows)), "--timeout-ms", "30000",
        "--formatter-property", "print.headers=true", "--formatter-property", "print.key=true")

    assert consumed.returncode == 0, consumed.stderr
    printed = list(printed_records(consumed.stdout))
    assert sorted(headers["message_id"] for headers, _, _ in printed) == sorted(rows)
    for headers, key, value in printed:
        row = rows[headers["message_id"]]
        assert headers == row.headers  # every header, as stored
        assert (headers["event_type"], headers["contract_version"]) == (
            events.EVENT_TYPE, str(events.CONTRACT_VERSION))
        assert headers["ce_id"] == row.id and headers["ce_subject"] == key == row.key
        assert json.loads(value) == row.payload
    assert_outbox_matches_contract()
