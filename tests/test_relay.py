"""The relay on real PostgreSQL and librdkafka's mock cluster: publish and read back, order
per key with two relays, claims, wake-up, retention."""

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from outbox import store
from outbox.mock_kafka import MockKafkaCluster
from outbox.relay import Relay
from outbox.topic import read_topic
from outbox.wakeup import Wakeup
from reminders import events
from tests.conftest import CycleRunner
from tests.contract import assert_event_valid
from tests.factories import Documents
from tests.ledger import AS_OF, expiring_in
from tests.relay_support import (
    BASE_TIME,
    RelayThread,
    as_relay,
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


def test_order_per_key_holds_with_two_relays_running_at_once(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    written = interleaved_rows(keys=30, per_key=8)
    settings = relay_settings(kafka.bootstrap_servers, batch_size=7)
    relays = [RelayThread(settings, relay_id=f"relay-{n}") for n in (1, 2)]
    for relay in relays:
        relay.start()
    try:
        wait_for(lambda: unpublished_count() == 0, timeout=60, what="every row published")
    finally:
        for relay in relays:
            relay.stop_and_join()

    assert all(r.relay.stats.published > 0 for r in relays), "both relays must have worked"
    records = read_topic(kafka.bootstrap_servers)
    assert first_seen_order(records) == {k: [str(i) for i in ids] for k, ids in written.items()}


def test_a_claim_takes_only_the_oldest_row_of_each_key_and_skips_held_keys(
    transactional_db: None,
) -> None:
    written = interleaved_rows(keys=3, per_key=2)
    with as_relay():
        first = store.claim_batch("default", batch_size=10, lease=timedelta(minutes=1),
                                  relay_id="a")
        second = store.claim_batch("default", batch_size=10, lease=timedelta(minutes=1),
                                   relay_id="b")

    assert sorted(m.id for m in first) == sorted(ids[0] for ids in written.values())
    assert second == []  # each key's head is held by "a", and the later rows wait behind it


def test_a_lapsed_claim_is_taken_over(transactional_db: None) -> None:
    row = insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
    with as_relay():
        store.claim_batch("default", batch_size=10, lease=timedelta(milliseconds=1), relay_id="a")
        wait_for(lambda: bool(store.claim_batch("default", batch_size=10,
                                                lease=timedelta(minutes=1), relay_id="b")),
                 timeout=5, what="the lapsed claim to be claimable")

    [state] = outbox_state()
    assert (state["id"], state["claimed_by"]) == (row.id, "b")


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
    now = datetime.now(UTC)
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
    now = datetime.now(UTC)
    for n in range(5):
        insert_outbox(f"k{n}", created_at=now - timedelta(days=10),
                      published_at=now - timedelta(days=8))

    with as_relay():
        assert Relay(relay_settings("127.0.0.1:9")).prune() == 5
    assert outbox_state() == []


def test_a_looping_relay_publishes_a_new_row_on_notification_not_on_polling(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    thread = RelayThread(relay_settings(kafka.bootstrap_servers,
                                        poll_interval=timedelta(minutes=10)))
    thread.start()
    try:
        wait_for(listening, timeout=30,
                 what="the relay to listen")
        insert_outbox(str(uuid.uuid4()), created_at=BASE_TIME)
        # A ten-minute poll interval: only the notification can bring it out this soon.
        wait_for(lambda: unpublished_count() == 0, timeout=15, what="the new row published")
    finally:
        thread.stop_and_join()


def listening() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("select count(*) from pg_stat_activity where query = 'listen outbox_messages'"
                       " and datname = current_database()")
        return int(cursor.fetchone()[0]) > 0
