"""A topic that keeps what it acknowledged (outbox/topic_watch.py; docs/outbox-relay.md, "A topic that
keeps what it acknowledged"): the relay reads the topic's configuration and refuses one that may
lose acknowledged records, says so when it cannot read it, records the partition count and
says so loudly when it changes; and its producer partitions keys as the Java client does.

Tansu answers DescribeConfigs (with the settings given at the topic's creation only) and
deletes and re-creates topics; librdkafka's mock cluster implements neither DescribeConfigs nor
CreatePartitions (and names no controller), and Tansu 0.6 not CreatePartitions: a partition
count change is a topic deleted and re-created with more partitions, which the relay sees as
it would see partitions added (its metadata reports more)."""

import ctypes
import logging
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from django.db import connection, connections
from prometheus_client import REGISTRY

from core.logs import log_event
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from outbox import metrics, store
from outbox.relay import Relay
from outbox.topic_watch import TopicWatch, UndurableTopicError
from tests.acceptance.test_relay_process import relay_env, run_relay
from tests.support.partitioner import murmur2, partition_of
from tests.support.relay_support import (
    BASE_TIME,
    TOPIC,
    as_relay,
    insert_outbox,
    relay_settings,
    unpublished_count,
    wait_for,
)
from tests.support.tansu_support import TansuBroker

DURABLE = {"min.insync.replicas": "2"}
FIELDS = "fields"  # where core.logs.log_event puts a line's fields on its record


@pytest.fixture(autouse=True)
def _relay_metrics() -> None:
    metrics.install_relay_metrics()  # as publish_outbox --loop does before serving them


def durability(state: str, topic: str = TOPIC) -> float | None:
    return REGISTRY.get_sample_value("profile_outbox_topic_durability",
                                     {"topic": topic, "state": state})


def create_topic(bootstrap: str, partitions: int, config: dict[str, str],
                 topic: str = TOPIC) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3, config=config)])[topic].result(30)


def delete_topic(bootstrap: str, topic: str = TOPIC) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)


def rows(n: int) -> list[str]:
    owners = [str(uuid.uuid4()) for _ in range(n)]
    for i, owner in enumerate(owners):
        insert_outbox(owner, created_at=BASE_TIME + timedelta(milliseconds=i), seq=i)
    return owners


def recorded(topic: str = TOPIC) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute("select partitions, previous_partitions, changed_at is not null"
                       " from outbox_topics where topic = %s", [topic])
        row = cursor.fetchone()
        return None if row is None else tuple(row)


@pytest.fixture
def relay_lines(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO, logger="outbox.relay"):
        yield caplog


def said(lines: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    """The fields of each `event` line (and its level, as `level`)."""
    return [{**getattr(r, FIELDS, {}), "level": r.levelno} for r in list(lines.records)
            if r.getMessage() == event]


# --- refused, for real (Tansu) --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("config", "setting"), [
    ({"min.insync.replicas": "1"}, "min.insync.replicas=1 (replicas: 1)"),
    ({"min.insync.replicas": "2", "unclean.leader.election.enable": "true"},
     "unclean.leader.election.enable=true"),
])
def test_a_topic_that_may_lose_what_it_acknowledges_is_refused_with_nothing_sent(
    transactional_db: None, tansu: TansuBroker, config: dict[str, str], setting: str
) -> None:
    create_topic(tansu.bootstrap_servers, 3, config)
    rows(5)
    done = run_relay(relay_env(tansu.bootstrap_servers, OUTBOX_ALLOW_UNDURABLE_TOPIC="off"))
    assert done.returncode == 4, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"CommandError: bad configuration: topic {TOPIC}: {setting}"), last
    assert "--add-config" in last and "OUTBOX_ALLOW_UNDURABLE_TOPIC=on" in last
    assert read_topic(tansu.bootstrap_servers, timeout=10) == []
    assert unpublished_count() == 5


def test_a_topic_that_keeps_what_it_acknowledges_is_published_to_and_recorded(
    transactional_db: None, tansu: TansuBroker, relay_lines: pytest.LogCaptureFixture
) -> None:
    create_topic(tansu.bootstrap_servers, 3, DURABLE)
    rows(6)
    with as_relay():
        stats = Relay(relay_settings(tansu.bootstrap_servers,
                                     allow_undurable_topic=False)).run_pass()
    assert stats.published == 6 and len(read_topic(tansu.bootstrap_servers)) == 6
    [line] = said(relay_lines, "topic keeps what it acknowledges")
    assert line["topic"] == TOPIC and line["min_insync_replicas"] == 2
    assert (durability("verified"), durability("unverified"), durability("allowed")) == (1, 0, 0)
    assert recorded() == (3, None, False)


def test_the_switch_publishes_to_a_single_copy_topic_and_says_so_once(
    transactional_db: None, tansu: TansuBroker, relay_lines: pytest.LogCaptureFixture
) -> None:
    rows(4)  # the topic is created by the relay's first look (auto-create): one copy
    with as_relay():
        stats = Relay(relay_settings(tansu.bootstrap_servers, batch_size=2)).run_pass()
    assert stats.published == 4
    [line] = said(relay_lines, "topic may lose acknowledged records, allowed by "
                               "OUTBOX_ALLOW_UNDURABLE_TOPIC")
    assert line["problem"].startswith("min.insync.replicas=1")
    assert durability("allowed") == 1 and durability("verified") == 0


# --- unverified: not refused ---------------------------------------------------------------


def test_a_cluster_that_cannot_describe_the_topic_leaves_it_unverified_and_publishes(
    transactional_db: None, kafka: MockKafkaCluster, relay_lines: pytest.LogCaptureFixture
) -> None:
    rows(5)
    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers, batch_size=2,
                                     allow_undurable_topic=False)).run_pass()
    assert stats.published == 5
    [line] = said(relay_lines, "topic durability unverified")
    # At once, from the metadata: asked, the mock's missing controller would cost a timeout.
    assert line["level"] == logging.WARNING and line["reason"] == "the cluster names no controller"
    assert durability("unverified") == 1 and durability("verified") == 0


class DeniedAdmin:
    """An admin client whose principal may read metadata but not DescribeConfigs."""

    def __init__(self, partitions: int = 3) -> None:
        self.partitions = partitions
        self.described = 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        parts = {p: SimpleNamespace(replicas=[1, 2, 3], leader=1, isrs=[1, 2, 3])
                 for p in range(self.partitions)}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=parts)},
                               controller_id=1, brokers={1: None, 2: None, 3: None})

    def describe_configs(self, resources: list[Any], request_timeout: float) -> Any:
        self.described += 1
        future: Future[Any] = Future()
        future.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
        return {resources[0]: future}


def test_a_principal_without_describe_configs_is_said_once_and_not_refused(
    transactional_db: None, relay_lines: pytest.LogCaptureFixture
) -> None:
    admin, now = DeniedAdmin(), [0.0]
    watch = TopicWatch(relay_settings("127.0.0.1:9", allow_undurable_topic=False), "default",
                       client_id="relay-t", emit=lambda level, event, fields: log_event(
                           logging.getLogger("outbox.relay"), level, event, **fields),
                       admin=lambda: admin, look_again_s=10, clock=lambda: now[0])
    message = SimpleNamespace(topic=TOPIC)
    with as_relay():
        watch.admit([message])
        watch.admit([message])  # admitted: not looked at again before its time
        now[0] = 11
        watch.look_again_if_due()
    assert admin.described == 2
    [line] = said(relay_lines, "topic durability unverified")
    assert "DescribeConfigs" in line["reason"]
    assert durability("unverified") == 1


# --- the partition count ------------------------------------------------------------------


@pytest.mark.slow
def test_a_partition_count_changed_between_passes_is_said_recorded_and_publishing_goes_on(
    transactional_db: None, tansu: TansuBroker, relay_lines: pytest.LogCaptureFixture
) -> None:
    settings = relay_settings(tansu.bootstrap_servers, allow_undurable_topic=False)
    create_topic(tansu.bootstrap_servers, 3, DURABLE)
    rows(3)
    with as_relay():
        assert Relay(settings).run_pass().published == 3
    assert recorded() == (3, None, False) and not said(relay_lines, "topic partition count changed")
    delete_topic(tansu.bootstrap_servers)
    create_topic(tansu.bootstrap_servers, 5, DURABLE)
    rows(4)
    with as_relay():
        assert Relay(settings).run_pass().published == 4  # no pause
    [line] = said(relay_lines, "topic partition count changed")
    assert line["level"] == logging.ERROR
    assert (line["previous"], line["partitions"]) == (3, 5)
    assert "order per key" in line["consequence"]
    assert recorded() == (5, 3, True)
    changed = REGISTRY.get_sample_value(
        "profile_outbox_topic_partitions_changed_timestamp_seconds", {"topic": TOPIC})
    assert changed is not None and changed > 0
    assert REGISTRY.get_sample_value("profile_outbox_topic_partitions", {"topic": TOPIC}) == 5


def mock_topic_delete(cluster: MockKafkaCluster, topic: str) -> None:
    lib = cluster._lib
    lib.rd_kafka_mock_topic_delete.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    assert lib.rd_kafka_mock_topic_delete(cluster._cluster, topic.encode()) == 0


@pytest.mark.slow
def test_a_partition_count_changed_under_a_running_relay_is_said_and_it_goes_on(
    transactional_db: None, kafka: MockKafkaCluster, relay_lines: pytest.LogCaptureFixture
) -> None:
    kafka.create_topic(TOPIC, 4, 3)
    rows(3)
    relay = Relay(relay_settings(kafka.bootstrap_servers))
    relay.topics.look_again_s = 0.2
    done: list[Any] = []

    def run() -> None:
        try:
            with as_relay():
                done.append(relay.run_loop())
        finally:
            connections.close_all()  # this thread's session

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: unpublished_count() == 0, what="the first rows published")
        mock_topic_delete(kafka, TOPIC)
        kafka.create_topic(TOPIC, 8, 3)
        wait_for(lambda: bool(said(relay_lines, "topic partition count changed")),
                 what="the change said")
        rows(5)
        wait_for(lambda: unpublished_count() == 0, what="the rows after the change published")
    finally:
        relay.stop.set()
        thread.join(timeout=60)
    [line] = said(relay_lines, "topic partition count changed")
    assert (line["previous"], line["partitions"]) == (4, 8)
    assert recorded() == (8, 4, True)
    assert done and done[0].published == 8


# --- the partitioner ----------------------------------------------------------------------


def test_murmur2_is_the_java_clients() -> None:
    # Values of org.apache.kafka.common.utils.Utils.murmur2 (Kafka's own UtilsTest), unsigned.
    assert [murmur2(s.encode()) for s in ("21", "foobar", "a-little-bit-long-string",
                                          "a-little-bit-longer-string")] == [
        x & 0xFFFFFFFF for x in (-973932308, -790332482, -985981536, -1486304829)]


def test_a_key_lands_on_the_partition_the_java_client_would_choose(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    kafka.create_topic(TOPIC, 6, 3)
    owners = rows(24)
    with as_relay():
        assert Relay(relay_settings(kafka.bootstrap_servers)).run_pass().published == 24
    placed = {r.key: r.partition for r in read_topic(kafka.bootstrap_servers)}
    assert placed == {o: partition_of(o, 6) for o in owners}
    assert len(set(placed.values())) > 1


def test_the_watch_raises_the_refusal_it_names(transactional_db: None) -> None:
    class Durable(DeniedAdmin):
        def describe_configs(self, resources: list[Any], request_timeout: float) -> Any:
            future: Future[Any] = Future()
            future.set_result({"min.insync.replicas": SimpleNamespace(value="1")})
            return {resources[0]: future}

    watch = TopicWatch(relay_settings("127.0.0.1:9", allow_undurable_topic=False), "default",
                       client_id="relay-t", emit=lambda *_: None, admin=Durable)
    with as_relay(), pytest.raises(UndurableTopicError) as raised:
        watch.admit([SimpleNamespace(topic=TOPIC)])
    assert str(raised.value).startswith(f"topic {TOPIC}: min.insync.replicas=1 (replicas: 3)")
    assert store.backlog("default").unpublished == 0
