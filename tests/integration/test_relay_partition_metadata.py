"""A partition the topic's metadata shows unable to take a record (docs/outbox-relay.md, "One
partition's outage"): its rows are not sent (no delivery timeout waited for, no copy made) but
deferred at once, and its deferred rows are due at once when the metadata shows it able again.

On librdkafka's mock cluster a partition is made leaderless in its metadata
(`rd_kafka_mock_partition_set_leader` to -1: a broker taken down stays leader there, and its
in-sync replicas never shrink); the in-sync rule and NOT_ENOUGH_REPLICAS_AFTER_APPEND are driven
through TopicWatch with a fake admin client."""

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from django.db import connection

from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from outbox.topic_watch import TopicWatch
from tests.support.mock_controls import set_partition_leader
from tests.support.partitioner import keys_on, partition_of
from tests.support.relay_support import (
    BASE_TIME,
    TOPIC,
    RelayThread,
    Row,
    as_relay,
    insert_outbox,
    relay_settings,
    wait_for,
)

PARTITIONS = 3
# Long enough that one batch waiting for a leaderless partition's delivery timeout fails the
# test's deadlines: the rows must not be sent at all.
DELIVERY_TIMEOUT = timedelta(seconds=60)


def published_ids() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("select id::text from outbox_messages m"
                       " where outbox_published_at(m) is not null")
        return {r[0] for r in cursor.fetchall()}


def slow_lane() -> list[tuple[str, int, str | None]]:
    """(id, attempts, last_error) of every row that left the stream."""
    with connection.cursor() as cursor:
        cursor.execute("select id::text, attempts, last_error from outbox_messages"
                       " where detoured_at is not null")
        return [(r[0], int(r[1]), r[2]) for r in cursor.fetchall()]


@contextmanager
def leaderless_partition_0(kafka: MockKafkaCluster) -> Iterator[tuple[list[Row], set[str]]]:
    """A topic whose partition 0 has no leader in the metadata, and 4 events per partition
    (2 keys, 2 events each); yields the rows and the ids bound for partition 0."""
    kafka.create_topic(TOPIC, PARTITIONS, 3)
    for partition in range(1, PARTITIONS):
        set_partition_leader(kafka, TOPIC, partition, kafka.broker_ids[partition])
    set_partition_leader(kafka, TOPIC, 0, -1)
    keys = [k for p in range(PARTITIONS) for k in keys_on(p, PARTITIONS, 2, "investor")]
    rows = [insert_outbox(k, created_at=BASE_TIME, seq=n) for n in range(2) for k in keys]
    yield rows, {str(r.id) for r in rows if partition_of(r.key, PARTITIONS) == 0}


def test_a_leaderless_partitions_rows_are_not_sent_and_the_others_go_at_once(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    with leaderless_partition_0(kafka) as (rows, on_0):
        elsewhere = {str(r.id) for r in rows} - on_0
        settings = relay_settings(kafka.bootstrap_servers, batch_size=4,
                                  delivery_timeout=DELIVERY_TIMEOUT,
                                  backoff_initial=timedelta(milliseconds=200),
                                  backoff_max=timedelta(milliseconds=400))
        relay = RelayThread(settings)
        relay.start()
        try:
            wait_for(lambda: published_ids() == elsewhere, timeout=20,
                     what="the other partitions' events recorded, no delivery timeout waited")
            # The slow lane retries partition 0's heads every few hundred ms, without sending:
            # a send would hold its pass for the 60 s delivery timeout.
            wait_for(lambda: relay.relay.stats.deferred >= 4 * 2, timeout=15,
                     what="partition 0's heads deferred again by the slow lane")
            detoured = slow_lane()
            assert {i for i, _a, _e in detoured} == on_0
            assert all(a == 0 for _i, a, _e in detoured), detoured
            # The two keys' heads say why; their later rows are held behind them, never sent.
            assert sorted(e for _i, _a, e in detoured if e is not None) == 2 * [
                "LEADER_NOT_AVAILABLE: not sent: the metadata shows no leader"]
            set_partition_leader(kafka, TOPIC, 0, kafka.broker_ids[0])
            wait_for(lambda: len(published_ids()) == len(rows), timeout=20,
                     what="partition 0's events delivered once it has a leader")
        finally:
            relay.stop_and_join()
    copies = Counter(r.message_id for r in read_topic(kafka.bootstrap_servers))
    assert copies == Counter({str(r.id): 1 for r in rows})


def test_a_partition_the_metadata_shows_back_has_its_deferred_rows_due_at_once(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    with leaderless_partition_0(kafka) as (rows, on_0):
        # Deferred rows wait 30 to 60 s by their backoff: far past the test's deadline.
        settings = relay_settings(kafka.bootstrap_servers, batch_size=4,
                                  delivery_timeout=DELIVERY_TIMEOUT,
                                  backoff_initial=timedelta(seconds=60),
                                  backoff_max=timedelta(seconds=120))
        relay = RelayThread(settings)
        relay.start()
        try:
            wait_for(lambda: {i for i, _a, _e in slow_lane()} == on_0
                     and len(published_ids()) == len(rows) - len(on_0), timeout=20,
                     what="partition 0's rows deferred, the others recorded")
            set_partition_leader(kafka, TOPIC, 0, kafka.broker_ids[0])
            # The next look (every 5 s while a partition is unable) sees it back.
            wait_for(lambda: len(published_ids()) == len(rows), timeout=15,
                     what="partition 0's deferred rows delivered at once, not at their delay")
        finally:
            relay.stop_and_join()
    assert published_ids() >= on_0


# --- the watch's rules, with a fake admin client ------------------------------------------


class Admin:
    """An admin client whose metadata the test sets: (leader, in-sync replicas) by partition,
    min.insync.replicas 2; `down` makes the next metadata request fail."""

    def __init__(self, partitions: dict[int, tuple[int, list[int]]]) -> None:
        self.partitions = partitions
        self.down = False
        self.looks = 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.looks += 1
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        parts = {p: SimpleNamespace(replicas=[1, 2, 3], leader=leader, isrs=isrs)
                 for p, (leader, isrs) in self.partitions.items()}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=parts)},
                               controller_id=1, brokers={1: None, 2: None, 3: None})

    def describe_configs(self, resources: list[Any], request_timeout: float) -> Any:
        future: Future[Any] = Future()
        future.set_result({"min.insync.replicas": SimpleNamespace(value="2")})
        return {resources[0]: future}


HEALTHY = (1, [1, 2, 3])


def rows_on(*partitions: int) -> list[Any]:
    return [SimpleNamespace(topic=TOPIC, key=keys_on(p, PARTITIONS, 1, "k")[0])
            for p in partitions]


@pytest.fixture
def watched(db: None) -> Iterator[tuple[TopicWatch, Admin, list[float], list[tuple[str, int]]]]:
    admin, now, ready = Admin(dict.fromkeys(range(PARTITIONS), HEALTHY)), [0.0], []

    def on_ready(topic: str, partition: int) -> bool:
        ready.append((topic, partition))
        return True

    watch = TopicWatch(relay_settings("127.0.0.1:9", allow_undurable_topic=False), "default",
                       client_id="relay-t", emit=lambda *_: None, admin=lambda: admin,
                       look_again_s=30, look_unready_s=5, clock=lambda: now[0],
                       on_ready=on_ready)
    with as_relay():
        yield watch, admin, now, ready


def codes(unsendable: dict[str, tuple[int, KafkaError]]) -> dict[int, int]:
    return {p: e.code() for p, e in unsendable.values()}


def test_the_watch_keeps_back_rows_of_a_partition_without_leader_or_in_sync_replicas(
    watched: tuple[TopicWatch, Admin, list[float], list[tuple[str, int]]],
) -> None:
    watch, admin, now, ready = watched
    admin.partitions = {0: (-1, [1, 2, 3]), 1: (1, [1]), 2: HEALTHY}

    assert codes(watch.admit(rows_on(0, 1, 2))) == {
        0: KafkaError.LEADER_NOT_AVAILABLE, 1: KafkaError.NOT_ENOUGH_REPLICAS}
    admin.partitions = dict.fromkeys(range(PARTITIONS), HEALTHY)
    now[0] = 4.9
    watch.look_again_if_due()
    assert admin.looks == 1 and ready == []  # not yet: every 5 s while one is unable
    now[0] = 5.0
    watch.look_again_if_due()
    assert watch.admit(rows_on(0, 1, 2)) == {} and ready == [(TOPIC, 0), (TOPIC, 1)]
    now[0] = 34.9
    watch.look_again_if_due()
    assert admin.looks == 2  # every 30 s once all are able


def test_a_look_that_fails_forgets_what_the_metadata_said_and_rows_are_sent_as_usual(
    watched: tuple[TopicWatch, Admin, list[float], list[tuple[str, int]]],
) -> None:
    watch, admin, now, ready = watched
    admin.partitions[0] = (-1, [1, 2, 3])
    assert codes(watch.admit(rows_on(0))) == {0: KafkaError.LEADER_NOT_AVAILABLE}
    admin.down, now[0] = True, 5.0

    watch.look_again_if_due()

    assert watch.admit(rows_on(0)) == {} and ready == []  # not known able: not "back"


def test_after_replicas_fell_short_after_an_append_nothing_is_sent_until_a_look_shows_them(
    watched: tuple[TopicWatch, Admin, list[float], list[tuple[str, int]]],
) -> None:
    watch, admin, now, ready = watched
    assert watch.admit(rows_on(0, 1)) == {}
    watch.partition_failed(TOPIC, 1, KafkaError(KafkaError._MSG_TIMED_OUT))  # no copy made
    watch.partition_failed(TOPIC, 2, KafkaError(KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND))

    assert codes(watch.admit(rows_on(0, 1, 2))) == {
        2: KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND}
    now[0] = 5.0  # looked at again soon, not in 30 s
    watch.look_again_if_due()
    assert admin.looks == 2 and watch.admit(rows_on(2)) == {} and ready == [(TOPIC, 2)]


def test_a_partition_that_did_not_answer_in_time_is_kept_back_until_it_does_or_moves(
    watched: tuple[TopicWatch, Admin, list[float], list[tuple[str, int]]],
) -> None:
    """A slow partition (its rows timed out while the rest of their batch was delivered): its
    rows are kept back, a look that shows the same leader does not lift it (the metadata says
    nothing of time), an answer in time does, and so does another leader."""
    watch, admin, now, ready = watched
    assert watch.admit(rows_on(0, 1, 2)) == {}
    watch.partitions_late(TOPIC, [1, 2], answered=[0])
    assert codes(watch.admit(rows_on(0, 1, 2))) == {1: KafkaError._MSG_TIMED_OUT,
                                                    2: KafkaError._MSG_TIMED_OUT}
    now[0] = 5.0
    watch.look_again_if_due()
    assert set(codes(watch.admit(rows_on(1, 2)))) == {1, 2} and ready == []

    watch.answered_in_time(TOPIC, 1)
    admin.partitions[2] = (4, [4, 2, 3])  # another leader, not one the late ones waited on
    now[0] = 10.0
    watch.look_again_if_due()

    assert watch.admit(rows_on(0, 1, 2)) == {} and ready == [(TOPIC, 1), (TOPIC, 2)]


# The slow-leader test's placement (tests/kafka/test_sick_cluster.py): broker 3 leads 0 and 1,
# broker 1 leads 2 and 3 (broker 3 follows them), broker 2 leads 4 and 5 (broker 1 follows).
PLACED = {0: (3, [3, 1]), 1: (3, [3, 1]), 2: (1, [1, 3]), 3: (1, [1, 3]),
          4: (2, [2, 1]), 5: (2, [2, 1])}


def placed_rows(*partitions: int) -> list[Any]:
    return [SimpleNamespace(topic=TOPIC, key=keys_on(p, len(PLACED), 1, "k")[0])
            for p in partitions]


def kept_back(watch: TopicWatch) -> set[int]:
    return set(codes(watch.admit(placed_rows(*PLACED))))


def test_a_late_partition_alone_keeps_back_what_waits_on_its_brokers_until_vouched_for(
    watched: tuple[TopicWatch, Admin, list[float], list[tuple[str, int]]],
) -> None:
    """Partition 0 late with nothing else answered: every partition led or followed by its
    brokers (3 and 1) is kept back; partition 4 answering in time vouches for broker 2 as a
    leader and broker 1 as a follower, which leaves the four that wait on broker 3 (or on broker
    1 as a leader); a look that shows broker 3 out of every partition's replicas frees them."""
    watch, admin, now, ready = watched
    admin.partitions = dict(PLACED)
    assert kept_back(watch) == set()

    watch.partitions_late(TOPIC, [0])
    assert kept_back(watch) == set(PLACED)
    watch.answered_in_time(TOPIC, 4)
    assert kept_back(watch) == {0, 1, 2, 3}
    assert ready == [(TOPIC, 4), (TOPIC, 5)]

    # The controller fenced broker 3: partitions 0 to 3 led by 1, followed by 2 (not suspected).
    admin.partitions = {**dict.fromkeys(range(4), (1, [1, 2])), 4: (2, [2, 1]), 5: (2, [2, 1])}
    now[0] = 5.0
    watch.look_again_if_due()
    assert kept_back(watch) == {0, 1, 2, 3}  # broker 3 forgotten; 1 is suspected as a leader
    watch.answered_in_time(TOPIC, 2)
    assert kept_back(watch) == set()
    assert ready == [(TOPIC, 4), (TOPIC, 5), (TOPIC, 0), (TOPIC, 1), (TOPIC, 2), (TOPIC, 3)]


def test_a_broker_the_relay_cannot_reach_keeps_back_only_the_partitions_it_leads(
    watched: tuple[TopicWatch, Admin, list[float], list[tuple[str, int]]],
) -> None:
    """Cut off from the relay only, broker 3 replicates for the cluster: partition 2 (which it
    follows) answering in time vouches for it as a follower; what it leads stays kept back."""
    watch, admin, _now, _ready = watched
    admin.partitions = dict(PLACED)
    watch.admit(placed_rows(0))
    watch.partitions_late(TOPIC, [0], answered=[4, 5])
    assert kept_back(watch) == {0, 1, 2, 3}

    watch.answered_in_time(TOPIC, 2)

    assert kept_back(watch) == {0, 1}
    watch.answered_in_time(TOPIC, 0)
    assert kept_back(watch) == set()


def test_the_look_goes_on_every_5_s_while_the_producer_finds_kafka_failing(
    db: None,
) -> None:
    admin, now, failing = Admin(dict.fromkeys(range(PARTITIONS), HEALTHY)), [0.0], [False]
    watch = TopicWatch(relay_settings("127.0.0.1:9", allow_undurable_topic=False), "default",
                       client_id="relay-t", emit=lambda *_: None, admin=lambda: admin,
                       look_again_s=30, look_unready_s=5, clock=lambda: now[0],
                       kafka_failing=lambda: failing[0])
    with as_relay():
        watch.admit(rows_on(0))
        failing[0], now[0] = True, 4.9
        watch.look_again_if_due()
        assert admin.looks == 1
        admin.partitions = {p: (1, [1]) for p in range(PARTITIONS)}  # every one short
        now[0] = 5.0
        watch.look_again_if_due()
        assert admin.looks == 2
        assert set(codes(watch.admit(rows_on(0, 1, 2)))) == {0, 1, 2}
