"""The relay on real PostgreSQL and librdkafka's mock cluster: publish and read back, one
leading relay and a standby taking over, order per key, reads, a late commit, wake-up,
retention."""

import json
import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection

from devtools.mock_kafka import MockKafkaCluster
from devtools.topic import read_topic
from outbox import store
from outbox.relay import Relay
from outbox.wakeup import Wakeup
from reminders import events
from tests.conftest import CycleRunner, test_database_url
from tests.support.contract import assert_event_valid
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, database_now, expiring_in
from tests.support.relay_support import (
    BASE_TIME,
    RelayThread,
    as_relay,
    event_payload,
    first_seen_order,
    insert_outbox,
    interleaved_rows,
    outbox_state,
    relay_settings,
    unpublished_count,
    wait_for,
)


def test_events_reach_the_topic_with_key_payload_and_headers_intact(
    run: CycleRunner, documents: Documents, kafka: MockKafkaCluster
) -> None:
    for days in (29, 6, 6, 0, -2):
        documents(expires_at=expiring_in(days))
    shared = documents(expires_at=expiring_in(3))
    documents(expires_at=expiring_in(1), owner_user_id=shared.owner_user_id)
    run(AS_OF)
    with connection.cursor() as cursor:
        cursor.execute("select id, message_key, payload::text, headers::text, created_at"
                       " from outbox_messages")
        rows = {str(r[0]): r for r in cursor.fetchall()}
    assert len(rows) == 6

    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers)).run_pass()

    assert stats.published == 6 and stats.failed == stats.released == 0
    records = read_topic(kafka.bootstrap_servers)
    assert sorted(r.message_id for r in records) == sorted(rows)
    for record in records:
        row_id, key, payload, headers, created_at = rows[record.message_id]
        body = record.json()
        assert_event_valid(body)
        assert body == json.loads(payload)
        assert record.key == key == body["ownerUserId"]
        stored = json.loads(headers)
        assert record.headers == {**stored, "aggregate_type": events.AGGREGATE_TYPE,
                                  "aggregate_id": key}
        assert record.headers["message_id"] == str(row_id)
        assert record.headers["event_type"] == events.EVENT_TYPE
        assert record.headers["contract_version"] == "1"
        assert record.timestamp_ms == int(created_at.timestamp() * 1000)
    [two_documents] = [r.json() for r in records if r.key == str(shared.owner_user_id)]
    assert len(two_documents["documents"]) == 2
    assert all(r["published_at"] is not None and r["attempts"] == 1 and r["claimed_by"] is None
               for r in outbox_state())


def relay_lock_holders() -> list[int]:
    """The sessions holding the relays' advisory lock on the test database (at most one)."""
    with connection.cursor() as cursor:
        cursor.execute("select pid from pg_locks where locktype = 'advisory' and granted"
                       " and database = (select oid from pg_database"
                       "                 where datname = current_database())"
                       " and classid = %s and objid = %s and objsubid = 1",
                       [store.RELAY_LOCK >> 32, store.RELAY_LOCK & 0xFFFF_FFFF])
        return [int(r[0]) for r in cursor.fetchall()]


def test_one_relay_leads_and_a_standby_takes_over_when_its_session_dies_order_per_key_holds(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    settings = relay_settings(kafka.bootstrap_servers, batch_size=7)
    resume = threading.Event()  # the first leader's backoff after its session died lasts until set
    first = RelayThread(settings, relay_id="relay-1", wait=lambda _delay: resume.wait(60))
    second = RelayThread(settings, relay_id="relay-2")
    first.start()
    wait_for(lambda: bool(relay_lock_holders()), timeout=30, what="the first relay to lead")
    second.start()
    try:
        before = interleaved_rows(keys=30, per_key=4)
        wait_for(lambda: unpublished_count() == 0, timeout=60, what="every row published")
        assert (first.relay.stats.published, second.relay.stats.published) == (120, 0)
        [leader_pid] = relay_lock_holders()
        with connection.cursor() as cursor:
            cursor.execute("select pg_terminate_backend(%s)", [leader_pid])
        after = interleaved_rows(keys=30, per_key=4)
        wait_for(lambda: unpublished_count() == 0, timeout=60, what="the standby to publish")
        assert second.relay.stats.published == 120  # the standby took over
        assert first.relay.stats.published == 120  # the first relay sent nothing more
    finally:
        resume.set()
        for relay in (first, second):
            relay.stop_and_join()

    written = {**before, **after}
    records = read_topic(kafka.bootstrap_servers)
    assert first_seen_order(records) == {k: [str(i) for i in ids] for k, ids in written.items()}


def test_a_read_takes_only_the_oldest_row_of_each_key_after_the_position(
    transactional_db: None,
) -> None:
    written = interleaved_rows(keys=3, per_key=2)
    heads = sorted(ids[0] for ids in written.values())
    with as_relay():
        first = store.read_batch("default", batch_size=10)
        after_first = store.read_batch("default", batch_size=10,
                                       after=(first[0].created_at, first[0].id))
        store.mark_published("default", [m.id for m in first])
        second = store.read_batch("default", batch_size=10)

    assert [m.id for m in first] == [m.id for m in sorted(first, key=lambda m: m.created_at)]
    assert sorted(m.id for m in first) == heads  # each key's next row waits behind its head
    assert [m.id for m in after_first] == [m.id for m in first[1:]]
    assert sorted(m.id for m in second) == sorted(ids[1] for ids in written.values())


def test_only_one_relay_leads_at_a_time_and_resigning_hands_over(transactional_db: None) -> None:
    other = psycopg.connect(test_database_url(), autocommit=True)
    try:
        with as_relay():
            assert store.try_to_lead("default") is True
            assert other.execute("select pg_try_advisory_lock(%s)",
                                 [store.RELAY_LOCK]).fetchone() == (False,)
            store.resign("default")
            assert other.execute("select pg_try_advisory_lock(%s)",
                                 [store.RELAY_LOCK]).fetchone() == (True,)
            assert store.try_to_lead("default") is False
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

    assert (stats.stood_by, stats.claimed, stats.published, unpublished_count()) == (True, 0, 0, 2)
    assert read_topic(kafka.bootstrap_servers) == []


def test_a_row_committed_late_behind_published_ones_is_not_skipped(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    """A transaction that started first commits last: its row sorts before rows already
    published when it becomes visible; the relay still publishes it."""
    # A transaction of its own (not autocommit), on the schema the tables live in.
    late = psycopg.connect(test_database_url(), options="-c search_path=profile")
    thread = RelayThread(relay_settings(kafka.bootstrap_servers, batch_size=2))
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
        thread.start()
        interleaved_rows(keys=5, per_key=2)
        wait_for(lambda: unpublished_count() == 0, timeout=60, what="the visible rows published")
        late.commit()
        wait_for(lambda: unpublished_count() == 0 and len(outbox_state()) == 11, timeout=60,
                 what="the late row published")
    finally:
        late.close()
        thread.stop_and_join()
    assert late_id in {r["id"] for r in outbox_state() if r["published_at"] is not None}
    assert str(late_id) in {r.message_id for r in read_topic(kafka.bootstrap_servers)}


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
