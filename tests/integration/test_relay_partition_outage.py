"""One partition's outage (docs/outbox-relay.md, "One partition's outage"), on real PostgreSQL
and librdkafka's mock cluster (3 brokers, 6 partitions, replication 3): partition 0's leader
alone is taken down for a while, with the relay's loop running. Every other partition's events
are delivered and recorded during the outage; partition 0's wait in the slow lane, no attempt
counted, and go out in order once it is back; no message is on the topic more than twice. And
a key deferred after its later row was read ahead: that row is held, not sent."""

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from django.db import connection
from prometheus_client import CollectorRegistry

from core.logs import _FIELDS
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import Record, read_topic
from outbox import metrics
from outbox.kafka import PARTITION_FAILING, PARTITION_RESTORED
from outbox.producer import RelayProducer
from outbox.relay import Relay
from tests.integration.test_relay_paths import (
    InThread,
    ObservedReader,
    copies_on_topic,
    position_move_waiting,
    position_moves_held,
)
from tests.support.clusters import free_port
from tests.support.mock_controls import set_partition_leader
from tests.support.partitioner import keys_on, partition_of
from tests.support.relay_support import (
    BASE_TIME,
    TOPIC,
    RelayThread,
    Row,
    as_relay,
    first_seen_order,
    insert_outbox,
    outbox_state,
    relay_settings,
    unpublished_count,
    wait_for,
)

PARTITIONS = 6
KEYS_PER_PARTITION = 6
EVENTS_PER_KEY = 2


def published_ids() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("select id::text from outbox_messages m"
                       " where outbox_published_at(m) is not null")
        return {r[0] for r in cursor.fetchall()}


def slow_lane_rows() -> list[tuple[str, int, bool]]:
    """(id, attempts, parked) of every row that left the stream."""
    with connection.cursor() as cursor:
        cursor.execute("select id::text, attempts, parked_at is not null from outbox_messages"
                       " where detoured_at is not null")
        return [(r[0], int(r[1]), bool(r[2])) for r in cursor.fetchall()]


def partition_lines(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [getattr(r, _FIELDS) for r in list(caplog.records) if r.getMessage() == event]


def test_one_partitions_leader_down_holds_back_only_its_keys_and_sends_no_message_a_third_time(
    transactional_db: None, kafka: MockKafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    down = lead_partition_0_by_one_broker_alone(kafka)
    written = Written.first_events()
    registry = CollectorRegistry()
    metrics.install_relay_metrics(registry)
    sample = partial(partition_0_sample, registry)
    deferred_before = sample("profile_outbox_deferred_total")
    settings = relay_settings(kafka.bootstrap_servers, batch_size=10,
                              delivery_timeout=timedelta(seconds=2),
                              backoff_initial=timedelta(milliseconds=300),
                              backoff_max=timedelta(seconds=1),
                              outage_log_interval=timedelta(seconds=1))
    kafka.set_down(down)
    relay = RelayThread(settings)
    with caplog.at_level(logging.INFO, logger="outbox.relay"):
        relay.start()
        try:
            check_every_other_partitions_events_published(written)
            check_partition_0s_rows_wait_in_the_slow_lane(written, sample, deferred_before)
            check_events_written_during_the_outage_go_out_too(written, caplog)

            kafka.set_up(down)
            wait_for(lambda: len(published_ids()) == len(written.rows), timeout=60,
                     what="partition 0's events delivered once it is back")
        finally:
            relay.stop_and_join()

    check_partition_0_restored_and_one_attempt_each(sample, caplog)
    check_the_topic_holds_each_event_at_most_twice_in_order(
        read_topic(kafka.bootstrap_servers), written)


@dataclass
class Written:
    """The events written, by where they go: partition 0 (its leader down) or elsewhere."""

    keys: list[list[str]]  # per partition
    interleaved: list[str]  # the keys, the partitions in turn
    rows: list[Row]
    on_down: set[str]
    elsewhere: set[str]

    @classmethod
    def first_events(cls) -> "Written":
        """EVENTS_PER_KEY events for each of KEYS_PER_PARTITION keys on every partition."""
        keys = [keys_on(p, PARTITIONS, KEYS_PER_PARTITION, "investor") for p in range(PARTITIONS)]
        interleaved = [k for group in zip(*keys, strict=True) for k in group]
        rows: list[Row] = [insert_outbox(k, created_at=BASE_TIME, seq=n)
                           for n in range(EVENTS_PER_KEY) for k in interleaved]
        on_down = {str(r.id) for r in rows if partition_of(r.key, PARTITIONS) == 0}
        elsewhere = {str(r.id) for r in rows} - on_down
        return cls(keys, interleaved, rows, on_down, elsewhere)

    def write_more(self, seq: int) -> None:
        """Events written during the outage: one more for every investor."""
        more = [insert_outbox(k, created_at=BASE_TIME, seq=seq) for k in self.interleaved]
        self.rows.extend(more)
        self.on_down.update(str(r.id) for r in more if partition_of(r.key, PARTITIONS) == 0)
        self.elsewhere.update(str(r.id) for r in more if partition_of(r.key, PARTITIONS) != 0)


def lead_partition_0_by_one_broker_alone(kafka: MockKafkaCluster) -> int:
    """The topic, partition 0 led by a broker that leads no other; that broker."""
    kafka.create_topic(TOPIC, PARTITIONS, 3)
    down, *others = kafka.broker_ids
    set_partition_leader(kafka, TOPIC, 0, down)  # the down broker leads partition 0 only
    for partition in range(1, PARTITIONS):
        set_partition_leader(kafka, TOPIC, partition, others[partition % len(others)])
    return down


def partition_0_sample(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(name, {"topic": TOPIC, "partition": "0"}) or 0.0


def check_every_other_partitions_events_published(written: Written) -> None:
    """During the outage: every other partition's events are recorded as published."""
    wait_for(lambda: published_ids() >= written.elsewhere, timeout=90,
             what="every event of the partitions with a leader recorded as published")
    assert published_ids() == written.elsewhere


def check_partition_0s_rows_wait_in_the_slow_lane(written: Written, sample: Callable[[str], float],
                                                  deferred_before: float) -> None:
    """... and partition 0's wait in the slow lane, no attempt counted: the heads that timed
    out are on their way again on the patient producer (which never gives up on them: no third
    copy), the later rows held behind them or kept back."""
    heads = len(written.keys[0])
    wait_for(lambda: sample("profile_outbox_deferred_total") - deferred_before
             >= heads and {i for i, _a, _p in slow_lane_rows()} == written.on_down, timeout=60,
             what="partition 0's rows deferred")
    detoured = slow_lane_rows()
    assert {i for i, _a, _p in detoured} == written.on_down
    assert all(attempts == 0 and not parked for _i, attempts, parked in detoured)
    assert sample("profile_outbox_partition_unavailable") == 1.0
    assert published_ids() == written.elsewhere


def check_events_written_during_the_outage_go_out_too(written: Written,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Events written now, with partition 0's rows waiting in the slow lane, go out too; the
    outage is logged for partition 0 alone."""
    written.write_more(EVENTS_PER_KEY)
    wait_for(lambda: published_ids() >= written.elsewhere, timeout=90,
             what="the events written during the outage recorded as published")
    assert published_ids() == written.elsewhere
    failing = partition_lines(caplog, PARTITION_FAILING)
    assert failing and {(f["topic"], f["partition"]) for f in failing} == {(TOPIC, 0)}


def check_partition_0_restored_and_one_attempt_each(sample: Callable[[str], float],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    assert sample("profile_outbox_partition_unavailable") == 0.0
    assert [f["partition"] for f in partition_lines(caplog, PARTITION_RESTORED)] == [0]
    # One attempt each: its delivery (mark_published counts it), none for the outage.
    assert all(attempts == 1 and not parked for _i, attempts, parked in slow_lane_rows())


def check_the_topic_holds_each_event_at_most_twice_in_order(records: list[Record],
                                                            written: Written) -> None:
    """Every event, none a third time, in order per key, partition 0's on partition 0."""
    copies = Counter(r.message_id for r in records)
    assert set(copies) == written.on_down | written.elsewhere
    assert max(copies.values()) <= 2, copies.most_common(3)
    by_key: dict[str, list[str]] = {}
    for row in written.rows:
        by_key.setdefault(row.key, []).append(str(row.id))
    assert first_seen_order(records) == by_key
    assert {r.partition for r in records if r.message_id in written.on_down} == {0}


def test_a_later_row_read_ahead_before_its_key_was_deferred_is_held_not_sent(
    transactional_db: None, kafka: MockKafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of two: [K1, A] with K1 bound for partition 0, whose leader is down (deferred),
    [B] (cut before K2: K is in flight), then the read ahead [K2, C], read before K1's detour
    is recorded, so the read itself says K2 is not held. Partition 0 is back before K2 would be
    produced: the relay holds K2 all the same, and K's rows go out in order."""
    monkeypatch.setattr("outbox.relay.StreamReader", ObservedReader)
    monkeypatch.setattr(ObservedReader, "finished", [])
    kafka.create_topic(TOPIC, 3, 3)
    for partition, broker in enumerate(kafka.broker_ids):
        set_partition_leader(kafka, TOPIC, partition, broker)
    [k] = keys_on(0, 3, 1, "K")
    a, b, c = keys_on(1, 3, 2, "up") + keys_on(2, 3, 1, "up")
    head = insert_outbox(k, created_at=BASE_TIME)
    others = [insert_outbox(a, created_at=BASE_TIME), insert_outbox(b, created_at=BASE_TIME)]
    later = insert_outbox(k, created_at=BASE_TIME, seq=1)
    others.append(insert_outbox(c, created_at=BASE_TIME))
    settings = relay_settings(kafka.bootstrap_servers, batch_size=2,
                              delivery_timeout=timedelta(seconds=2),
                              backoff_initial=timedelta(milliseconds=100),
                              backoff_max=timedelta(milliseconds=200))
    kafka.set_down(kafka.broker_ids[0])
    relay = Relay(settings)

    with position_moves_held() as release:
        thread = InThread(relay.publish_available)
        thread.start()
        wait_for(position_move_waiting, timeout=30, what="the first batch's record to wait")
        wait_for(lambda: len(ObservedReader.finished) >= 3, timeout=30,
                 what="the read ahead of the third batch to be done")
        kafka.set_up(kafka.broker_ids[0])  # back before K2 is produced: it would overtake K1
        release()
        thread.finish()
    with as_relay():
        relay.close()

    state = {r["id"]: r for r in outbox_state()}
    assert state[head.id]["detoured_at"] is not None and state[head.id]["attempts"] == 0
    assert state[later.id]["detoured_at"] is not None  # held behind its key's head
    assert (state[later.id]["published_at"], state[later.id]["attempts"]) == (None, 0)
    assert all(state[r.id]["published_at"] is not None for r in others)

    with as_relay():
        relay = Relay(settings)
        wait_for(lambda: relay.run_pass().published >= 0 and unpublished_count() == 0,
                 timeout=30, what="K's rows delivered once partition 0 is back")
        relay.close()
    assert first_seen_order(read_topic(kafka.bootstrap_servers))[k] == [
        str(head.id), str(later.id)]
    assert copies_on_topic(kafka.bootstrap_servers) == {
        str(r.id): 1 for r in [head, later, *others]}


def test_the_question_before_a_deferral_is_answered_by_a_live_cluster_only(
        kafka: MockKafkaCluster) -> None:
    """`RelayProducer.cluster_answers`, asked before timed-out rows are blamed on their
    partition: a metadata request that a live cluster answers, a dead broker does not (within
    the delivery timeout), and that is not even asked once stop is set."""
    stop = threading.Event()
    said: list[str] = []
    live = RelayProducer(relay_settings(kafka.bootstrap_servers), "relay-test",
                         emit=lambda _level, event, _fields: said.append(event), stop=stop)
    dead = RelayProducer(relay_settings(f"127.0.0.1:{free_port()}",
                                        delivery_timeout=timedelta(seconds=1)),
                         "relay-test", emit=lambda *_args: None, stop=stop)
    try:
        assert live.cluster_answers()
        assert not dead.cluster_answers()
        stop.set()
        assert not live.cluster_answers()
        assert said == []  # a question, not an outage report: the batch's record says that
    finally:
        live.close()
        dead.close()


def _delivered_from(bootstrap: str, partitions: list[int], count: int,
                    timeout: float = 30.0) -> set[str]:
    """The message ids of the first `count` records on `partitions` (read by assignment: the
    topic's other partitions may have no broker to answer), waited for up to `timeout`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in partitions])
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(seen) < count and time.monotonic() < deadline:
            record = consumer.poll(0.2)
            if record is not None and record.error() is None:
                seen.add(dict(record.headers() or [])["message_id"].decode())
    finally:
        consumer.close()
    assert len(seen) >= count, f"only {len(seen)} of {count} records delivered"
    return seen


def test_a_cluster_that_dies_halfway_through_a_batch_is_not_one_partitions_outage(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    """Partitions 0 and 1 take their rows, partition 2's leader is down; then, before its row
    times out, every broker goes down. The batch looks like partition 2's outage (rows
    delivered beside a timed-out one), but no broker answers: the position stops before that
    row and nothing is deferred. Once the cluster is back, it goes out through the stream, with
    no attempt counted (before `cluster_answers`, it was detoured to the slow lane)."""
    kafka.create_topic(TOPIC, 3, 3)
    brokers = kafka.broker_ids
    for partition, broker in enumerate(brokers):
        set_partition_leader(kafka, TOPIC, partition, broker)
    rows = [insert_outbox(keys_on(p, 3, 1, "investor")[0], created_at=BASE_TIME)
            for p in range(3)]
    taken = {str(rows[0].id), str(rows[1].id)}
    kafka.set_down(brokers[2])
    # Long enough that partition 2's row cannot time out before the other brokers are down.
    settings = relay_settings(kafka.bootstrap_servers, delivery_timeout=timedelta(seconds=8),
                              backoff_initial=timedelta(milliseconds=300),
                              backoff_max=timedelta(seconds=1))
    relay = RelayThread(settings)
    relay.start()
    try:
        assert _delivered_from(kafka.bootstrap_servers, [0, 1], 2) == taken
        kafka.set_down(brokers[0], brokers[1])
        wait_for(lambda: published_ids() == taken, timeout=60,
                 what="the rows the cluster took before it died recorded")
        assert slow_lane_rows() == []  # partition 2's row stays in the stream

        kafka.set_up(*brokers)
        wait_for(lambda: len(published_ids()) == 3, timeout=60,
                 what="partition 2's row delivered once the cluster is back")
    finally:
        relay.stop_and_join()
    assert slow_lane_rows() == []
    assert {(r["attempts"], r["last_error"]) for r in outbox_state()} == {(0, None)}
