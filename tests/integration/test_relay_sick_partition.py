"""A partition the relay cannot use while the rest of the cluster answers (docs/outbox-relay.md,
"One partition's outage"), on real PostgreSQL and librdkafka's mock cluster (3 brokers, 6
partitions, replication 3, partition 0's leader alone on broker 1): every other owner's events
go on.

- The head row's partition has no reachable leader (broker 1 down; the mock's metadata still
  names it) and the same owner's next row is right behind it: the batch the stream cuts is that
  one row, nothing of it is delivered, and before the probe batch the stream read it again and
  again (the wedge: 0 of the other owners' events delivered in the finding's 60 s).
- Partition 0's leader takes every request and answers after the delivery timeout (the mock
  broker's round-trip time): every batch carrying a row of it waited out the timeout, and a
  retry that times out again may leave one copy more on the topic each time."""

import time
from collections import Counter
from datetime import timedelta

from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from outbox.relay import Relay
from tests.support import chaos_report
from tests.support.mock_controls import set_broker_rtt, set_partition_leader
from tests.support.partitioner import keys_on, keys_on_every_partition, partition_of
from tests.support.relay_support import (
    BASE_TIME,
    TOPIC,
    RelayThread,
    Row,
    as_relay,
    detoured_count,
    first_seen_order,
    insert_outbox,
    published_ids,
    relay_settings,
    unpublished_count,
    wait_for,
)

PARTITIONS = 6
DELIVERY_TIMEOUT = timedelta(seconds=2)


def partition_0_on_broker_1(kafka: MockKafkaCluster) -> int:
    """Partition 0 led by broker 1, which leads nothing else; returns broker 1."""
    kafka.create_topic(TOPIC, PARTITIONS, 3)
    sick, *others = kafka.broker_ids
    set_partition_leader(kafka, TOPIC, 0, sick)
    for partition in range(1, PARTITIONS):
        set_partition_leader(kafka, TOPIC, partition, others[partition % len(others)])
    return sick


def others_on_healthy_partitions(count: int) -> list[Row]:
    """One event each for `count` owners of partitions 1 to 5, written after the head's."""
    owners = [k for p in range(1, PARTITIONS)
              for k in keys_on(p, PARTITIONS, count // (PARTITIONS - 1), f"other{p}")]
    return [insert_outbox(k, created_at=BASE_TIME + timedelta(seconds=1)) for k in owners]


def by_key(rows: list[Row]) -> dict[str, list[str]]:
    order: dict[str, list[str]] = {}
    for row in rows:
        order.setdefault(row.key, []).append(str(row.id))
    return order


def test_a_head_row_whose_partition_cannot_be_reached_holds_back_only_its_own_key(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    sick = partition_0_on_broker_1(kafka)
    [head_key] = keys_on(0, PARTITIONS, 1, "head")
    # One owner's two 30-day reminders on two days, at the head of the outbox.
    head = [insert_outbox(head_key, created_at=BASE_TIME, seq=n) for n in range(2)]
    others = others_on_healthy_partitions(100)
    settings = relay_settings(kafka.bootstrap_servers, batch_size=20,
                              delivery_timeout=DELIVERY_TIMEOUT,
                              backoff_initial=timedelta(milliseconds=200),
                              backoff_max=timedelta(seconds=1))
    kafka.set_down(sick)
    relay = RelayThread(settings)
    began = time.monotonic()
    relay.start()
    try:
        # Before the probe batch: none of them, whatever the deadline (the wedge).
        wait_for(lambda: published_ids() >= {str(r.id) for r in others}, timeout=30,
                 what="every other owner's event recorded while the head's leader is down")
        took = time.monotonic() - began
        assert not published_ids() & {str(r.id) for r in head}
        detours = detoured_count()
        chaos_report.shown("wedge behind the head row (mock cluster)",
                           other_owners_delivered=len(others), seconds_into_outage=round(took, 1),
                           delivery_timeout_s=DELIVERY_TIMEOUT.total_seconds(), detours=detours)
        assert detours == len(head)
        kafka.set_up(sick)
        wait_for(lambda: published_ids() >= {str(r.id) for r in head}, timeout=30,
                 what="the head owner's rows delivered once its leader is back")
    finally:
        relay.stop_and_join()
    records = read_topic(kafka.bootstrap_servers)
    copies = Counter(r.message_id for r in records)
    assert set(copies) == {str(r.id) for r in head + others}
    assert max(copies.values()) <= 2, copies.most_common(3)
    assert first_seen_order(records) == by_key(head + others)


def test_a_slow_leader_costs_the_other_partitions_one_delivery_timeout_and_no_third_copy(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    sick = partition_0_on_broker_1(kafka)
    # Owners of every partition in turn: each batch of 12 carries two of partition 0's.
    keys = keys_on_every_partition(PARTITIONS, 30, "owner")
    rows = [insert_outbox(k, created_at=BASE_TIME, seq=n) for n in range(2) for k in keys]
    on_0 = {str(r.id) for r in rows if partition_of(r.key, PARTITIONS) == 0}
    elsewhere = {str(r.id) for r in rows} - on_0
    settings = relay_settings(kafka.bootstrap_servers, batch_size=12,
                              delivery_timeout=DELIVERY_TIMEOUT,
                              backoff_initial=timedelta(milliseconds=200),
                              backoff_max=timedelta(seconds=1))
    # Every answer of partition 0's leader comes three delivery timeouts late.
    set_broker_rtt(kafka, sick, int(3 * DELIVERY_TIMEOUT.total_seconds() * 1000))
    relay = RelayThread(settings)
    began = time.monotonic()
    relay.start()
    try:
        # Before the fix each batch carrying a row of partition 0 waited the whole timeout: 15
        # batches carry one of its owners' first rows, two batches in flight at a time, about
        # 8 timeouts (16 s) for the others' 300 events.
        wait_for(lambda: published_ids() >= elsewhere, timeout=4 * DELIVERY_TIMEOUT.total_seconds(),
                 what="the other partitions' events recorded within a few delivery timeouts")
        took = time.monotonic() - began
        others_took = round(took, 1)
        set_broker_rtt(kafka, sick, 0)
        wait_for(lambda: published_ids() >= on_0, timeout=60,
                 what="partition 0's events delivered once its leader answers in time")
    finally:
        relay.stop_and_join()
    records = read_topic(kafka.bootstrap_servers)
    copies = Counter(r.message_id for r in records)
    chaos_report.shown("slow leader (mock cluster)", healthy_events=len(elsewhere),
                       healthy_recorded_after_s=others_took,
                       delivery_timeout_s=DELIVERY_TIMEOUT.total_seconds(),
                       answers_late_by_s=3 * DELIVERY_TIMEOUT.total_seconds(),
                       copies=dict(sorted(Counter(copies.values()).items())))
    assert set(copies) == on_0 | elsewhere
    assert max(copies.values()) <= 2, copies.most_common(3)
    assert first_seen_order(records) == by_key(rows)


def test_rows_of_both_batches_in_flight_when_nothing_answered_go_to_the_patient_producer(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    """Every broker down: the first batch stops the position (nothing delivered), the second,
    in flight behind it, is dropped unrecorded. Both batches' rows may be on the topic (a
    time-out in the client says nothing of the request), so their next attempt is the patient
    producer's, whichever batch they were in (the second's were sent again by the relay's own
    producer: a third copy of five events on the real cluster)."""
    kafka.create_topic(TOPIC, PARTITIONS, 3)
    # Time enough for the first row on a loaded machine: a time-out then would leave brokers
    # suspected, and the rows of the partitions they lead kept back, never sent.
    settings = relay_settings(kafka.bootstrap_servers, batch_size=6, batch_size_min=6,
                              delivery_timeout=timedelta(seconds=3))
    insert_outbox("before", created_at=BASE_TIME)
    relay = Relay(settings)
    try:
        with as_relay():  # the topic looked at, while up (a loaded machine may need a second try)
            wait_for(lambda: relay.publish_available().published == 1 or unpublished_count() == 0,
                     timeout=30, what="the first row published while the cluster is up")
        assert not relay.topics.holding_back
        kafka.set_down()
        rows = [insert_outbox(k, created_at=BASE_TIME)
                for k in keys_on_every_partition(PARTITIONS, 2, "owner")]
        with as_relay():
            outcome = relay.publish_available()
        assert outcome.published == 0 and outcome.released == len(rows)
        assert relay.kafka.patient.possibly_appended == {str(r.id) for r in rows}
    finally:
        with as_relay():
            relay.close()
