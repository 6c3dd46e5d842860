"""The relay on real PostgreSQL and librdkafka's mock cluster: publish and read back (on Tansu
too), one leading relay and a standby taking over, order per key, reads, a late commit,
wake-up, retention."""

import json
import logging
import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection

from core.db import raw_connection
from core.roles import WORKER_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from outbox import store
from outbox.relay import Relay, Wakeup
from reminders import events
from tests.support import chaos_report
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner, as_role, test_database_url
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, database_now, expiring_in
from tests.support.relay_support import (
    BASE_TIME,
    RelayThread,
    as_relay,
    assert_sent_as_stored,
    event_payload,
    first_seen_order,
    insert_outbox,
    interleaved_rows,
    outbox_state,
    read_stream,
    relay_settings,
    standby_takeover,
    stored_rows,
    unpublished_count,
    wait_for,
    written_order,
)
from tests.support.tansu_support import tansu_version


@pytest.mark.parametrize("broker", ["kafka", pytest.param("tansu", marks=pytest.mark.slow)])
def test_events_reach_the_topic_with_key_payload_headers_and_the_contract_intact(
    run: CycleRunner, documents: Documents, broker: str, request: pytest.FixtureRequest
) -> None:
    """On librdkafka's mock cluster and on Tansu, a broker process that validates every value
    against the contract in its schema registry."""
    bootstrap_servers: str = request.getfixturevalue(broker).bootstrap_servers
    for days in (29, 6, 6, 0, -2):
        documents(expires_at=expiring_in(days))
    shared = documents(expires_at=expiring_in(3))
    documents(expires_at=expiring_in(1), owner_user_id=shared.owner_user_id)
    run(AS_OF)
    rows = stored_rows()
    assert len(rows) == 6

    with as_relay():
        stats = Relay(relay_settings(bootstrap_servers)).run_pass()

    assert stats.published == 6 and stats.failed == stats.released == 0
    records = read_topic(bootstrap_servers)
    assert sorted(r.message_id for r in records) == sorted(rows)
    for record in records:
        assert_sent_as_stored(record, rows[record.message_id])
    [two_documents] = [r.json() for r in records if r.key == str(shared.owner_user_id)]
    assert len(two_documents["documents"]) == 2
    # Published in the stream: by the position, with no row written after the insert.
    assert all(r["published_at"] is not None and r["attempts"] == 0 and r["detoured_at"] is None
               for r in outbox_state())
    if broker == "tansu":
        chaos_report.record("relay on Tansu: round trip", broker=tansu_version(), events=6,
                            headers_checked=6 * len(records[0].headers), contract_valid=6)
    assert_outbox_matches_contract()


def test_one_relay_leads_and_a_standby_takes_over_when_its_session_dies_order_per_key_holds(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    written = standby_takeover(relay_settings(kafka.bootstrap_servers, batch_size=7))
    records = read_topic(kafka.bootstrap_servers)
    assert first_seen_order(records) == written_order(written)


def test_a_row_a_writer_of_the_previous_release_stored_is_sent_with_its_aggregate(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    """outbox_headers' five-argument form (a worker of the release before migration 0010, in a
    rolling deploy) stores no aggregate headers: the read adds them, as before (and the
    CloudEvents headers, migration 0014)."""
    row_id = uuid.uuid4()
    with as_role(WORKER_ROLE), connection.cursor() as cursor:
        cursor.execute(
            "insert into outbox_messages (id, aggregate_type, aggregate_id, event_type,"
            " contract_version, topic, message_key, payload, headers, created_at, attempts)"
            " values (%s, %s, 'old-writer', %s, %s, %s, 'old-writer', %s,"
            "         outbox_headers(%s, 'run-1', %s, %s, null), now(), 0)",
            [row_id, events.AGGREGATE_TYPE, events.EVENT_TYPE, events.CONTRACT_VERSION,
             events.TOPIC, json.dumps(event_payload("old-writer", 0)), row_id,
             events.EVENT_TYPE, events.CONTRACT_VERSION])
    with connection.cursor() as cursor:  # the worker may not read the outbox
        cursor.execute("select headers::text from outbox_messages where id = %s", [row_id])
        [stored] = cursor.fetchone()
    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers)).run_pass()

    assert "aggregate_id" not in json.loads(stored)
    assert stats.published == 1
    [record] = read_topic(kafka.bootstrap_servers)
    # The CloudEvents headers are completed too (tests/integration/test_cloudevents.py).
    assert {k: v for k, v in record.headers.items() if not k.startswith("ce_")} == {
        "message_id": str(row_id), "correlation_id": "run-1", "event_type": events.EVENT_TYPE,
        "contract_version": str(events.CONTRACT_VERSION), "aggregate_type": events.AGGREGATE_TYPE,
        "aggregate_id": "old-writer", "content-type": "application/json"}
    assert record.headers["ce_id"] == str(row_id)


def test_a_stream_batch_ends_before_a_key_it_already_has_or_one_in_flight(
    transactional_db: None,
) -> None:
    written = interleaved_rows(keys=3, per_key=2)
    firsts = [ids[0] for ids in written.values()]
    with as_relay():
        relay = Relay(relay_settings("127.0.0.1:9"))
        start = store.read_position("default")
        first = relay.stream.read(start, busy=set()).messages
        assert first[-1].position is not None
        # The next read, while the first batch is in flight: its keys come back first.
        blocked = relay.stream.read(first[-1].position, busy={m.key for m in first}).messages
        alone = relay.stream.read(first[-1].position, busy=set()).messages
        relay.close()

    assert sorted(uuid.UUID(m.id) for m in first) == sorted(firsts)  # one row per key: cut at a repeat
    places = [(int(m.position[0]), m.position[1]) for m in first if m.position is not None]
    assert len(places) == len(first) and places == sorted(places)  # in write order
    assert blocked == []
    assert sorted(uuid.UUID(m.id) for m in alone) == sorted(ids[1] for ids in written.values())


def test_an_open_transaction_holds_the_stream_back_and_no_row_is_skipped(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    """A transaction that started first commits last: rows committed after it wait (their
    transactions are younger than one still running), and once it commits, its row comes
    first; nothing is read past an unsettled transaction, so nothing can commit behind the
    position."""
    # A transaction of its own (not autocommit), on the schema the tables live in.
    late = psycopg.connect(test_database_url(), options="-c search_path=profile")
    try:
        late_id = uuid.uuid4()
        late.execute(
            "insert into outbox_messages (id, aggregate_type, aggregate_id, event_type,"
            " contract_version, topic, message_key, payload, headers, created_at)"
            " values (%s, %s, 'late-key', %s, %s, %s, 'late-key', %s, %s, %s)",
            [late_id, events.AGGREGATE_TYPE, events.EVENT_TYPE, events.CONTRACT_VERSION,
             events.TOPIC, json.dumps(event_payload("late-key", 0)),
             json.dumps({"message_id": str(late_id), "event_type": events.EVENT_TYPE,
                         "contract_version": str(events.CONTRACT_VERSION)}),
             BASE_TIME - timedelta(days=1)])
        interleaved_rows(keys=5, per_key=2)
        with as_relay():
            held_back = read_stream(batch_size=100,
                                          after=store.read_position("default"))
            # The pass waits a moment for the held rows, not the operators' minute.
            stats = Relay(relay_settings(kafka.bootstrap_servers, batch_size=2)).run_pass(
                held_bound_s=1.0)
        assert held_back == [] and stats.published == 0
        assert unpublished_count() == 10
        late.commit()
    finally:
        late.close()
    with as_relay():
        first = read_stream(batch_size=1, after=store.read_position("default"))
        stats = Relay(relay_settings(kafka.bootstrap_servers, batch_size=2)).run_pass()

    assert [m.id for m in first] == [str(late_id)]
    assert stats.published == 11 and unpublished_count() == 0
    assert str(late_id) in {r.message_id for r in read_topic(kafka.bootstrap_servers)}


def test_a_stream_held_back_by_an_open_transaction_is_said_once_and_its_end_too(
    transactional_db: None, kafka: MockKafkaCluster, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("outbox.relay.STREAM_HELD_WARN_S", 0.0)
    holder = psycopg.connect(test_database_url(), options="-c search_path=profile")
    try:
        holder.execute("insert into outbox_relay_batches (upto_txid, upto_seq, messages)"
                       " values ('1', 0, 0)")  # any write: the transaction has an id now
        insert_outbox("waiting", created_at=BASE_TIME)
        with as_relay(), caplog.at_level(logging.INFO, logger="outbox.relay"):
            relay = Relay(relay_settings(kafka.bootstrap_servers))
            looks = [relay.publish_available().read for _ in range(3)]
            holder.rollback()
            looks.append(relay.publish_available().read)
            relay.close()
    finally:
        holder.close()

    said = [r.getMessage() for r in caplog.records if "stream" in r.getMessage()]
    assert looks == [0, 0, 0, 1]
    assert said == ["stream held back by a transaction open on the database server",
                    "stream moving again"]


def test_only_one_relay_leads_at_a_time_and_resigning_hands_over(transactional_db: None) -> None:
    other = psycopg.connect(test_database_url(), autocommit=True)
    try:
        with as_relay():
            pid = store.try_to_lead("default")
            assert pid is not None
            assert pid == raw_connection("default").info.backend_pid  # the one holding the lock
            assert other.execute("select pg_try_advisory_lock(%s)",
                                 [store.RELAY_LOCK]).fetchone() == (False,)
            store.resign("default")
            assert other.execute("select pg_try_advisory_lock(%s)",
                                 [store.RELAY_LOCK]).fetchone() == (True,)
            assert store.try_to_lead("default") is None
    finally:
        other.close()


def test_a_pass_while_another_relay_leads_stands_by_and_sends_nothing(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    interleaved_rows(keys=2, per_key=1)
    leader = psycopg.connect(test_database_url(), autocommit=True)
    try:
        leader.execute("select pg_advisory_lock(%s)", [store.RELAY_LOCK])
        with as_relay():
            stats = Relay(relay_settings(kafka.bootstrap_servers)).run_pass()
    finally:
        leader.close()

    assert (stats.stood_by, stats.read, stats.published, unpublished_count()) == (True, 0, 0, 2)
    assert read_topic(kafka.bootstrap_servers) == []


def test_an_insert_wakes_a_listening_relay(transactional_db: None) -> None:
    wakeup = Wakeup()
    stop = threading.Event()
    try:
        assert wakeup.wait(0.05, stop) is False  # listening now; nothing yet
        insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
        assert wakeup.wait(10, stop) is True
    finally:
        wakeup.close()


def test_retention_deletes_only_old_published_rows(transactional_db: None) -> None:
    now = database_now()  # the relay's retention is on the database's now()
    old = insert_outbox("a", created_at=now - timedelta(days=9), published_at=now - timedelta(days=8))
    recent = insert_outbox("b", created_at=now - timedelta(days=9),
                           published_at=now - timedelta(days=6))
    unpublished = insert_outbox("c", created_at=now - timedelta(days=30))
    parked = insert_outbox("d", created_at=now - timedelta(days=30),
                           parked_at=now - timedelta(days=29))

    with as_relay():
        pruned = Relay(relay_settings("127.0.0.1:9")).prune()

    assert pruned == 1
    assert {r["id"] for r in outbox_state()} == {recent.id, unpublished.id, parked.id}
    assert old.id not in {r["id"] for r in outbox_state()}


def test_retention_deletes_stream_rows_of_batches_older_than_it_and_then_the_batches(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    for n in range(4):
        insert_outbox(f"old-{n}", created_at=BASE_TIME)
    with as_relay():
        settings = relay_settings(kafka.bootstrap_servers, batch_size=2)
        assert Relay(settings).run_pass().published == 4
    with connection.cursor() as cursor:  # those two batches were published 8 days ago
        cursor.execute("update outbox_relay_batches set published_at = now() - interval '8 days'")
    recent = [insert_outbox(f"new-{n}", created_at=BASE_TIME) for n in range(3)]
    with as_relay():
        relay = Relay(settings)
        assert relay.run_pass().published == 3
        assert relay.stats.pruned == 4

    assert {r["id"] for r in outbox_state()} == {r.id for r in recent}
    assert all(r["published_at"] is not None for r in outbox_state())
    with connection.cursor() as cursor:
        cursor.execute("select count(*), min(published_at) > now() - interval '1 day'"
                       " from outbox_relay_batches")
        assert cursor.fetchone() == (2, True)  # the old batches are forgotten


@pytest.mark.parametrize("chunk", [2])
def test_retention_works_in_bounded_chunks(transactional_db: None, chunk: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("outbox.relay.PRUNE_CHUNK", chunk)
    now = database_now()  # the relay's retention is on the database's now()
    for n in range(5):
        insert_outbox(f"k{n}", created_at=now - timedelta(days=10),
                      published_at=now - timedelta(days=8))

    with as_relay():
        assert Relay(relay_settings("127.0.0.1:9")).prune() == 5
    assert outbox_state() == []


def test_a_looping_relay_publishes_a_new_row_on_notification_not_on_polling(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    wakeup = WatchedWakeup()
    thread = RelayThread(relay_settings(kafka.bootstrap_servers,
                                        poll_interval=timedelta(minutes=10)), wakeup=wakeup)
    thread.start()
    try:
        # Its first pass found nothing: from now on only a notification can bring the relay
        # out before the ten-minute poll interval.
        wait_for(wakeup.waiting.is_set, timeout=30, what="the relay's first empty pass")
        assert wakeup.backend_pid is not None and listening(wakeup.backend_pid)
        insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
        wait_for(lambda: unpublished_count() == 0, timeout=15, what="the new row published")
    finally:
        thread.stop_and_join()
    assert wakeup.woken[:1] == [True]  # the first wait ended on the notification


class WatchedWakeup(Wakeup):
    """The relay's wake-up, telling the test its listening session, when the relay first
    waits, and how each wait ended (True: a notification)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()
        self.backend_pid: int | None = None
        self.woken: list[bool] = []

    def listen(self) -> psycopg.Connection[Any] | None:
        conn = super().listen()
        if conn is not None:
            self.backend_pid = conn.info.backend_pid
        return conn

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        self.waiting.set()
        woken = super().wait(timeout, stop)
        self.woken.append(woken)
        return woken


def listening(pid: int) -> bool:
    """Whether session `pid`, on the test database, listens for new outbox rows."""
    with connection.cursor() as cursor:
        cursor.execute("select count(*) from pg_stat_activity where pid = %s"
                       " and datname = current_database() and query = 'listen outbox_messages'",
                       [pid])
        return int(cursor.fetchone()[0]) == 1
