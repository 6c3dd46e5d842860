"""Paths of the stream relay that only a race, a partial outage or a rare state reaches, on
real PostgreSQL and librdkafka's mock cluster: a takeover while batches are in flight, a key
detoured after its later row was read ahead, a transaction that takes its id first and inserts
last, retention around the slow lane, bounded retention chunks, one broker of three down, a
producer replaced after a fatal error, and the slow lane's turn in a long backlog."""

import json
import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, ClassVar

import psycopg
import pytest
from confluent_kafka import KafkaError, Producer
from django.db import connection, connections

from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from outbox import store
from outbox.lanes import RelayStats, StreamReader
from outbox.relay import Relay
from reminders import events
from tests.integration.test_relay_failures import fix_payload
from tests.support.db_roles import test_database_url
from tests.support.ledger import database_now
from tests.support.mock_controls import PRODUCE_API, push_request_errors, set_partition_leader
from tests.support.partitioner import keys_on, partition_of
from tests.support.relay_support import (
    BASE_TIME,
    TOPIC,
    Row,
    as_relay,
    event_payload,
    first_seen_order,
    insert_outbox,
    outbox_state,
    read_stream,
    relay_lock_holders,
    relay_settings,
    unpublished_count,
    wait_for,
)

POISON = '{"filler": "' + "x" * 1_200_000 + '"}'  # over the producer's message.max.bytes


# --- helpers ---------------------------------------------------------------------------------


class InThread(threading.Thread):
    """`work()` as the relay's role on a thread of its own (its own database session)."""

    def __init__(self, work: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.result: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with as_relay():
                self.result = self.work()
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()

    def finish(self, timeout: float = 60.0) -> object:
        self.join(timeout)
        assert not self.is_alive(), "the relay's thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def owner_session() -> psycopg.Connection[Any]:
    """A session of the tables' owner, autocommit, on the schema the tables live in."""
    return psycopg.connect(test_database_url(), autocommit=True,
                           options="-c search_path=profile")


def positions(rows: list[Row]) -> list[tuple[str, int]]:
    """The rows' places in the stream, in the given order."""
    with connection.cursor() as cursor:
        cursor.execute("select id, txid::text, seq from outbox_messages where id = any(%s)",
                       [[r.id for r in rows]])
        found = {r[0]: (r[1], int(r[2])) for r in cursor.fetchall()}
    return [found[r.id] for r in rows]


def batches_after(start: store.Position) -> list[tuple[str, int, int]]:
    """The batches recorded past `start` (the batches table outlives a test's rows)."""
    with connection.cursor() as cursor:
        cursor.execute("select upto_txid::text, upto_seq, messages from outbox_relay_batches"
                       " where (upto_txid, upto_seq) > (%s::xid8, %s)"
                       " order by upto_txid, upto_seq", list(start))
        return [(r[0], int(r[1]), int(r[2])) for r in cursor.fetchall()]


HOLD_LOCK = 4_242_002


@contextmanager
def position_moves_held() -> Iterator[Callable[[], None]]:
    """While inside, and until the given release is called, a relay that moves the stream's
    position waits (on an advisory lock a session of the test holds), in its transaction."""
    with connection.cursor() as cursor:
        cursor.execute(f"""
            create function hold_position_move() returns trigger language plpgsql as $$
            begin
                perform pg_advisory_xact_lock({HOLD_LOCK});
                return new;
            end $$;
            create trigger hold_position_move before update on outbox_relay_position
                for each row execute function hold_position_move();""")
    holder = psycopg.connect(test_database_url(), autocommit=True)
    holder.execute("select pg_advisory_lock(%s)", [HOLD_LOCK])
    try:
        yield holder.close  # closing the session releases the lock
    finally:
        holder.close()
        with connection.cursor() as cursor:
            cursor.execute("drop trigger if exists hold_position_move on outbox_relay_position;"
                           " drop function if exists hold_position_move()")


def position_move_waiting() -> bool:
    """A session of this test database waits for position_moves_held's lock."""
    with connection.cursor() as cursor:
        cursor.execute("select count(*) from pg_locks l join pg_database d on d.oid = l.database"
                       " where d.datname = current_database() and l.locktype = 'advisory'"
                       " and not l.granted and l.objid = %s", [HOLD_LOCK])
        return int(cursor.fetchone()[0]) > 0


def copies_on_topic(bootstrap: str) -> Counter[str]:
    return Counter(r.message_id for r in read_topic(bootstrap))


def ids(rows: list[Row]) -> list[str]:
    return [str(r.id) for r in rows]


@contextmanager
def relay_lines(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[str], int]]:
    """Within: how many times the relay has logged an event so far (DEBUG included)."""
    with caplog.at_level(logging.DEBUG, logger="outbox.relay"):
        yield lambda event: sum(1 for r in list(caplog.records) if r.getMessage() == event)


# --- a takeover while batches are in flight -------------------------------------------------


def test_a_position_moved_while_batches_await_their_reports_stands_the_relay_down(
    transactional_db: None, kafka: MockKafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Another session moves the position while the relay's two batches wait for reports (all
    brokers down): the relay records nothing of them, waits for what it sent, resigns; the
    leader sends again what lies after the position it finds (at least once)."""
    rows = [insert_outbox(f"key-{n}", created_at=BASE_TIME, seq=n) for n in range(8)]
    places = positions(rows)
    start = store.read_position("default")
    settings = relay_settings(kafka.bootstrap_servers, batch_size=4,
                              delivery_timeout=timedelta(seconds=30))
    kafka.set_down()
    relay = Relay(settings, relay_id="relay-old")

    looked: tuple[RelayStats, list[int]] = (relay.stats, [-1])

    def publish_then_look() -> None:
        nonlocal looked
        relay.publish_available()
        looked = relay.stats, relay_lock_holders()  # while the relay's session is still open
        relay.close()

    with relay_lines(caplog) as logged:
        thread = InThread(publish_then_look)
        thread.start()
        wait_for(lambda: logged("batch produced") == 2, timeout=30,
                 what="both batches produced and waiting for their reports")
        moved_to = places[1]  # as if another relay had delivered the first two rows
        with owner_session() as other:
            other.execute("update outbox_relay_position set txid = %s::xid8, seq = %s",
                          list(moved_to))
        kafka.set_up()
        thread.finish()
        stats, holders = looked
        stood_down = logged("stream position moved by another relay, standing by")

    assert stood_down == 1
    assert holders == []  # it resigned: the lock is free although its session is alive
    assert (stats.published, stats.batches) == (0, 0)
    assert store.read_position("default") == moved_to and batches_after(start) == []
    # What it sent was delivered (it waited for its reports before standing down).
    assert copies_on_topic(kafka.bootstrap_servers) == dict.fromkeys(ids(rows), 1)

    with as_relay():
        leader = Relay(settings, relay_id="relay-new").run_pass()

    assert leader.published == 6 and unpublished_count() == 0
    assert copies_on_topic(kafka.bootstrap_servers) == {**dict.fromkeys(ids(rows[:2]), 1),
                                                         **dict.fromkeys(ids(rows[2:]), 2)}


# --- a key detoured after its later row was read ahead --------------------------------------


class ObservedReader(StreamReader):
    """The relay's stream reader, counting the reads it has finished (on whichever thread)."""

    finished: ClassVar[list[store.Position]] = []

    def _read(self, after: store.Position, rows: int,
              session: psycopg.Connection[Any] | None = None) -> store.Read:
        read = super()._read(after, rows, session)
        self.finished.append(after)
        return read


def test_a_later_row_read_ahead_before_its_key_was_detoured_is_held_not_sent(
    transactional_db: None, kafka: MockKafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of two: [K1, A] with K1 refused, [B] (cut before K2: K is in flight), then the
    read ahead [K2, C], read before K1's detour is recorded (the record waits until it is
    done), so the read itself says K2 is not held: the relay holds it all the same."""
    monkeypatch.setattr("outbox.relay.StreamReader", ObservedReader)
    monkeypatch.setattr(ObservedReader, "finished", [])
    head = insert_outbox("K", created_at=BASE_TIME, payload=POISON)
    a = insert_outbox("A", created_at=BASE_TIME)
    b = insert_outbox("B", created_at=BASE_TIME)
    later = insert_outbox("K", created_at=BASE_TIME, seq=1)
    c = insert_outbox("C", created_at=BASE_TIME)
    settings = relay_settings(kafka.bootstrap_servers, batch_size=2, max_attempts=1)
    relay = Relay(settings)

    with position_moves_held() as release:
        thread = InThread(relay.publish_available)
        thread.start()
        wait_for(position_move_waiting, timeout=30, what="the first batch's record to wait")
        wait_for(lambda: len(ObservedReader.finished) >= 3, timeout=30,
                 what="the read ahead of the third batch to be done")
        release()
        thread.finish()
    with as_relay():
        relay.close()

    state = {r["id"]: r for r in outbox_state()}
    assert state[head.id]["parked_at"] is not None
    assert state[later.id]["detoured_at"] is not None  # held behind its key's head
    assert (state[later.id]["published_at"], state[later.id]["attempts"]) == (None, 0)
    assert copies_on_topic(kafka.bootstrap_servers) == Counter(ids([a, b, c]))  # each once

    fix_payload(head.id)
    with as_relay():
        assert store.requeue_parked("default", [head.id]) == [head.id]
        assert Relay(settings).run_pass().published == 2
    assert unpublished_count() == 0
    assert first_seen_order(read_topic(kafka.bootstrap_servers))["K"] == ids([head, later])


# --- a transaction that takes its id first and inserts last ---------------------------------


def insert_in(writer: psycopg.Connection[Any], key: str) -> uuid.UUID:
    """An outbox row inserted in `writer`'s open transaction, as the worker inserts it."""
    row_id = uuid.uuid4()
    writer.execute(
        "insert into outbox_messages (id, aggregate_type, aggregate_id, event_type,"
        " contract_version, topic, message_key, payload, headers, created_at)"
        " values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        [row_id, events.AGGREGATE_TYPE, key, events.EVENT_TYPE, events.CONTRACT_VERSION,
         TOPIC, key, json.dumps(event_payload(key, 0)),
         json.dumps({"message_id": str(row_id), "event_type": events.EVENT_TYPE,
                     "contract_version": str(events.CONTRACT_VERSION)}), BASE_TIME])
    return row_id


def test_the_row_with_the_lower_txid_and_the_higher_seq_comes_first_and_none_is_skipped(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    """Transaction A takes its id, B inserts and commits, then A inserts and commits: A's row
    has the lower txid and the higher seq. The stream is (txid, seq): A's row first."""
    first = psycopg.connect(test_database_url(), options="-c search_path=profile")
    try:
        first.execute("select pg_current_xact_id()")
        second = insert_outbox("second", created_at=BASE_TIME)  # its own transaction, committed
        with as_relay():
            held_back = read_stream(batch_size=10,
                                          after=store.read_position("default"))
        first_id = insert_in(first, "first")
        first.commit()
    finally:
        first.close()
    with connection.cursor() as cursor:
        cursor.execute("select id, txid::text::bigint, seq from outbox_messages")
        place = {r[0]: (r[1], r[2]) for r in cursor.fetchall()}
    assert place[first_id][0] < place[second.id][0] and place[first_id][1] > place[second.id][1]

    with as_relay():
        read = read_stream(batch_size=10, after=store.read_position("default"))
        stats = Relay(relay_settings(kafka.bootstrap_servers, batch_size=1)).run_pass()

    assert held_back == []  # B's row waits while A, older, is open
    assert [m.id for m in read] == [str(first_id), str(second.id)]
    assert (stats.published, unpublished_count()) == (2, 0)
    assert sorted(copies_on_topic(kafka.bootstrap_servers)) == sorted([str(first_id),
                                                                       str(second.id)])


# --- retention ------------------------------------------------------------------------------


def age_batches(days: int = 8) -> None:
    with connection.cursor() as cursor:
        cursor.execute("update outbox_relay_batches"
                       " set published_at = now() - make_interval(days => %s)", [days])


def test_retention_keeps_waiting_held_and_parked_rows_behind_old_batches(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    parked = insert_outbox("parked", created_at=BASE_TIME, parked_at=BASE_TIME)
    behind_parked = insert_outbox("parked", created_at=BASE_TIME, seq=1)
    refused = insert_outbox("refused", created_at=BASE_TIME, payload=POISON)
    behind_refused = insert_outbox("refused", created_at=BASE_TIME, seq=1)
    delivered = [insert_outbox(f"ok-{n}", created_at=BASE_TIME, seq=n) for n in range(4)]
    settings = relay_settings(kafka.bootstrap_servers, max_attempts=5,
                              backoff_initial=timedelta(hours=1), backoff_max=timedelta(hours=2))
    with as_relay():
        stats = Relay(settings).run_pass()
    assert (stats.published, stats.failed) == (4, 1)
    age_batches()  # every row above is behind a batch older than the retention

    with as_relay():
        pruned = Relay(settings).prune()

    assert pruned == len(delivered)
    state = {r["id"]: r for r in outbox_state()}
    assert set(state) == {parked.id, behind_parked.id, refused.id, behind_refused.id}
    assert all(r["published_at"] is None and r["detoured_at"] is not None for r in state.values())
    assert state[refused.id]["attempts"] == 1 and state[refused.id]["available_at"] is not None
    assert state[parked.id]["parked_at"] is not None


def test_each_retention_statement_deletes_at_most_its_chunk_of_each_lane(
    transactional_db: None, kafka: MockKafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunk = 2
    monkeypatch.setattr("outbox.relay.PRUNE_CHUNK", chunk)
    for n in range(5):
        insert_outbox(f"stream-{n}", created_at=BASE_TIME)
    with as_relay():
        assert Relay(relay_settings(kafka.bootstrap_servers)).run_pass().published == 5
    age_batches()
    now = database_now()
    for n in range(5):
        insert_outbox(f"slow-{n}", created_at=now - timedelta(days=10),
                      published_at=now - timedelta(days=8))

    def lanes() -> tuple[int, int]:
        with connection.cursor() as cursor:  # the relay's session, inside its chunk's transaction
            cursor.execute("select count(*) filter (where detoured_at is null),"
                           " count(*) filter (where detoured_at is not null)"
                           " from outbox_messages")
            stream, slow = cursor.fetchone()
        return int(stream), int(slow)

    statements: list[tuple[int, int, int]] = []  # (returned, stream deleted, slow deleted)
    prune_published = store.prune_published

    def observed(using: str, retention: timedelta, size: int) -> int:
        before = lanes()
        deleted = prune_published(using, retention, size)
        after = lanes()
        statements.append((deleted, before[0] - after[0], before[1] - after[1]))
        return deleted

    monkeypatch.setattr(store, "prune_published", observed)
    with as_relay():
        assert Relay(relay_settings(kafka.bootstrap_servers)).prune() == 10

    assert all(stream <= chunk and slow <= chunk for _, stream, slow in statements), statements
    assert all(deleted == stream + slow for deleted, stream, slow in statements), statements
    assert [sum(s[n] for s in statements) for n in (1, 2)] == [5, 5]
    assert outbox_state() == []


# --- one broker of three down ---------------------------------------------------------------


def test_one_broker_down_defers_the_row_of_its_partition_and_the_position_passes_it(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    """Partition 0's leader is down: in the batch [up, down, up] the row bound for partition 0
    times out while the others are acknowledged, so it leaves for the slow lane with no attempt
    counted and the position passes the batch and the one behind it. Once the broker is back,
    the slow lane delivers it, and nothing went out twice."""
    kafka.create_topic(TOPIC, 3, 3)
    for partition, broker in enumerate(kafka.broker_ids):
        set_partition_leader(kafka, TOPIC, partition, broker)
    up_keys = keys_on(1, 3, 3, "up") + keys_on(2, 3, 2, "up")
    [down_key] = keys_on(0, 3, 1, "down")
    first = [insert_outbox(k, created_at=BASE_TIME) for k in (up_keys[0], down_key, up_keys[1])]
    behind = [insert_outbox(k, created_at=BASE_TIME) for k in up_keys[2:]]
    places = positions(first + behind)
    start = store.read_position("default")
    kafka.set_down(kafka.broker_ids[0])
    settings = relay_settings(kafka.bootstrap_servers, batch_size=3,
                              delivery_timeout=timedelta(seconds=3))

    with as_relay():
        relay = Relay(settings)
        outcome = relay.publish_available()
        relay.close()

    assert (outcome.published, outcome.released, outcome.deferred) == (len(behind) + 2, 0, 1)
    assert store.read_position("default") == places[-1]
    assert [b[2] for b in batches_after(start)] == [2, len(behind)]
    state = {r["id"]: r for r in outbox_state()}
    assert {i for i, r in state.items() if r["published_at"] is None} == {first[1].id}
    down = state[first[1].id]
    assert down["detoured_at"] is not None and down["attempts"] == 0
    assert down["available_at"] is not None and "_MSG_TIMED_OUT" in down["last_error"]

    kafka.set_up(kafka.broker_ids[0])
    with as_relay():
        relay = Relay(settings)
        wait_for(lambda: relay.run_pass().published >= 0 and unpublished_count() == 0,
                 timeout=30, what="the deferred row delivered after its retry delay")
        relay.close()

    assert {r["id"]: r["attempts"] for r in outbox_state()}[first[1].id] == 1  # its delivery
    records = read_topic(kafka.bootstrap_servers)
    assert {r.message_id: r.partition for r in records} == {
        str(r.id): partition_of(r.key, 3) for r in first + behind}
    assert sorted(Counter(r.message_id for r in records).items()) == sorted(
        (i, 1) for i in ids(first + behind))


# --- a producer replaced after a fatal error ------------------------------------------------


class RecordingProducer(Producer):
    """confluent-kafka's producer, remembering each one made and what each was handed."""

    made: ClassVar[list["RecordingProducer"]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.produced: list[str] = []
        self.made.append(self)

    def produce(self, *args: Any, **kwargs: Any) -> None:
        headers = kwargs.get("headers") or {}
        self.produced.append(str(headers.get("message_id")))
        super().produce(*args, **kwargs)


def test_a_fatal_producer_error_replaces_the_producer_and_the_new_one_delivers(
    transactional_db: None, kafka: MockKafkaCluster, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("outbox.kafka.Producer", RecordingProducer)
    monkeypatch.setattr(RecordingProducer, "made", [])
    settings = relay_settings(kafka.bootstrap_servers)
    before = [insert_outbox(k, created_at=BASE_TIME) for k in ("a", "b")]
    relay = Relay(settings)
    with as_relay():
        assert relay.run_pass().published == 2
    # The next Produce (each partition has had one) is answered with a sequence
    # desynchronization: fatal for an idempotent producer.
    push_request_errors(kafka, PRODUCE_API, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER)
    after = [insert_outbox(k, created_at=BASE_TIME, seq=n)
             for n in range(1, 4) for k in ("a", "b")]
    with as_relay():
        with relay_lines(caplog) as logged:
            def a_pass_leaves_nothing_unpublished() -> bool:
                relay.run_pass()
                return unpublished_count() == 0

            wait_for(a_pass_leaves_nothing_unpublished, timeout=30, what="every row published")
            replaced = logged("producer failed fatally, starting a new one")
        relay.close()

    assert replaced == 1
    # Each row counted published once, the batch the error failed included (a relay's totals
    # run over its passes: `run_pass` returns them, not the pass's own).
    assert relay.stats.published == len(before) + len(after)
    old, new = RecordingProducer.made
    assert old is not new
    assert sorted(old.produced[:2]) == sorted(ids(before))
    # The batch the error failed is sent again on the new producer, and every later batch.
    assert set(old.produced) & set(new.produced)
    later = set(ids(after)) - set(old.produced)
    assert later and later <= set(new.produced)
    records = read_topic(kafka.bootstrap_servers)
    assert {r.message_id for r in records} == set(ids([*before, *after]))
    assert first_seen_order(records) == {
        "a": ids([before[0], *after[0::2]]), "b": ids([before[1], *after[1::2]])}


# --- the slow lane's turn during a long backlog ---------------------------------------------


def test_a_due_slow_lane_row_goes_out_before_a_long_stream_backlog_is_done(
    transactional_db: None, kafka: MockKafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    per_call = 3
    monkeypatch.setattr("outbox.lanes.STREAM_BATCHES_PER_CALL", per_call)
    slow = insert_outbox("slow", created_at=BASE_TIME, parked_at=BASE_TIME)
    backlog = [insert_outbox(f"stream-{n}", created_at=BASE_TIME) for n in range(12)]
    seen: list[tuple[bool, int]] = []  # after each batch: slow row published, stream rows left

    with owner_session() as owner:

        def after_batch(stats: RelayStats) -> None:
            if stats.batches == 1:  # due from now on: re-queued while the stream runs
                owner.execute("update outbox_messages set parked_at = null where id = %s",
                              [slow.id])
            row = owner.execute(
                "select (select outbox_published_at(m) is not null from outbox_messages m"
                "        where id = %s),"
                "       (select count(*) from outbox_messages m where detoured_at is null"
                "        and outbox_published_at(m) is null)", [slow.id]).fetchone()
            assert row is not None
            seen.append((bool(row[0]), int(row[1])))

        with as_relay():
            stats = Relay(relay_settings(kafka.bootstrap_servers, batch_size=1),
                          on_batch=after_batch).run_pass()

    assert stats.published == len(backlog) + 1 and unpublished_count() == 0
    left_when_slow_went = next(left for published, left in seen if published)
    assert left_when_slow_went == len(backlog) - per_call
