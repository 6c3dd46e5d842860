"""Migration 0005_stream_position on an outbox that has rows: an upgrade with a backlog, or with
writers running, loses nothing and sends nothing twice; a downgrade finds every published row
published and keeps the slow lane's waiting rows waiting; upgraded again, the rest goes out once."""

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader

from core.db import apply_sql_file
from core.roles import ROLES_SQL
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from outbox.relay import Relay
from tests.integration.test_relay_failures import fix_payload
from tests.support.db_roles import test_database_url
from tests.support.ledger import database_now
from tests.support.relay_support import (
    as_relay,
    first_seen_order,
    insert_outbox,
    outbox_state,
    relay_settings,
    unpublished_count,
    wait_for,
)

BEFORE = ("outbox", "0004_merge_0003_relay_claims_0003_requeue_permission")
# The newest outbox migration, read from the files (a test that stopped short of it would leave
# the next tests without the latest functions): 0005 and every one after it.
[AFTER] = MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes("outbox")
STREAM = ("outbox", "0005_stream_position")


def migrate(target: tuple[str, str]) -> None:
    """Migrate the outbox to `target`; forward, grant the roles again (as a release does: the
    tables a migration creates have no grants until `apply_db_roles`)."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])
    if target == AFTER:
        apply_sql_file(ROLES_SQL)


@pytest.fixture
def before_0005(transactional_db: None) -> Iterator[None]:
    """The outbox as it was before 0005; migrated forward again whatever happens."""
    migrate(BEFORE)
    try:
        yield
    finally:
        migrate(AFTER)


def insert_per_row_design(key: str, *, published: bool = False, parked: bool = False) -> str:
    """A row as the relay before 0005 left it (published_at, parked_at; no stream columns)."""
    now = database_now()
    with connection.cursor() as cursor:
        cursor.execute(
            "insert into outbox_messages (id, aggregate_type, aggregate_id, event_type,"
            " contract_version, topic, message_key, payload, headers, created_at, published_at,"
            " parked_at, attempts)"
            " values (gen_random_uuid(), 'Profile', %s, 'DocumentExpiryReminderKafkaEvent', 1,"
            " 'pin.profile.document-expiry-reminders.v1', %s, '{}', '{}', %s, %s, %s, 0)"
            " returning id",
            [key, key, now - timedelta(hours=1), now if published else None,
             now if parked else None])
        return str(cursor.fetchone()[0])


def test_an_upgrade_keeps_published_rows_published_and_sends_the_backlog_once(
    before_0005: None, kafka: MockKafkaCluster
) -> None:
    published = insert_per_row_design("a", published=True)
    waiting = insert_per_row_design("b")
    parked = insert_per_row_design("c", parked=True)

    migrate(AFTER)
    fresh = str(insert_outbox("d", created_at=database_now()).id)
    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers)).run_pass()

    state = {str(r["id"]): r for r in outbox_state()}
    assert stats.published == 2  # the waiting row (by the slow lane) and the new one
    assert sorted(r.message_id for r in read_topic(kafka.bootstrap_servers)) \
        == sorted([waiting, fresh])
    assert all(state[i]["published_at"] is not None for i in (published, waiting, fresh))
    assert state[parked]["published_at"] is None and state[parked]["parked_at"] is not None
    assert state[waiting]["detoured_at"] is not None and state[fresh]["detoured_at"] is None


def test_a_downgrade_stamps_published_at_on_rows_the_stream_published(
    before_0005: None, kafka: MockKafkaCluster
) -> None:
    migrate(AFTER)
    rows = [str(insert_outbox(f"k{n}", created_at=database_now()).id) for n in range(3)]
    with as_relay():
        assert Relay(relay_settings(kafka.bootstrap_servers)).run_pass().published == 3
    waiting = str(insert_outbox("late", created_at=database_now()).id)

    migrate(BEFORE)

    with connection.cursor() as cursor:
        cursor.execute("select id::text, published_at is not null from outbox_messages")
        published = dict(cursor.fetchall())
    assert published == {**dict.fromkeys(rows, True), waiting: False}


def _open_writer() -> psycopg.Connection[Any]:
    """A writer's transaction of its own (not autocommit), on the schema the tables live in."""
    return psycopg.connect(test_database_url(), options="-c search_path=profile")


def _insert_on(writer: psycopg.Connection[Any], key: str) -> str:
    """An outbox row as the worker inserts it (no stream column named), on `writer`."""
    row = writer.execute(
        "insert into outbox_messages (id, aggregate_type, aggregate_id, event_type,"
        " contract_version, topic, message_key, payload, headers, created_at)"
        " values (gen_random_uuid(), 'Profile', %s, 'DocumentExpiryReminderKafkaEvent', 1,"
        " 'pin.profile.document-expiry-reminders.v1', %s, '{}', '{}', now()) returning id",
        [key, key]).fetchone()
    assert row is not None
    return str(row[0])


def _lock_waiters() -> int:
    """Sessions waiting for a lock on outbox_messages."""
    with connection.cursor() as cursor:
        cursor.execute("select count(*) from pg_locks where not granted"
                       " and relation = 'outbox_messages'::regclass")
        return int(cursor.fetchone()[0])


class _InThread(threading.Thread):
    """`work()` on a thread of its own (its own database connection), its error kept."""

    def __init__(self, work: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()

    def finish(self) -> None:
        self.join(60)
        assert not self.is_alive(), "the thread did not finish"
        if self.error is not None:
            raise self.error


def _topic_copies(bootstrap: str) -> Counter[str]:
    return Counter(r.message_id for r in read_topic(bootstrap))


def test_an_upgrade_with_writers_running_loses_no_row_and_sends_none_twice(
    before_0005: None, kafka: MockKafkaCluster
) -> None:
    """Writers around the upgrade: one committed before it, one whose insert the upgrade waits
    for, one that took its transaction id before the upgrade and inserts (waiting for the
    upgrade's lock) after it, and one after it."""
    before = insert_per_row_design("before")
    early = _open_writer()  # a transaction with an id, older than the upgrade's
    inside = _open_writer()
    try:
        early.execute("select pg_current_xact_id()")
        waited_for = _insert_on(inside, "inside")  # holds its lock: the upgrade waits for it
        upgrade = _InThread(lambda: migrate(STREAM))
        upgrade.start()
        wait_for(lambda: _lock_waiters() == 1, timeout=30, what="the upgrade to wait for a writer")
        early_ids: list[str] = []
        late_insert = _InThread(lambda: early_ids.append(_insert_on(early, "early")))
        late_insert.start()
        wait_for(lambda: _lock_waiters() == 2, timeout=30,
                 what="the early writer's insert to wait for the upgrade")
        inside.commit()
        upgrade.finish()
        late_insert.finish()
        early.commit()
    finally:
        early.close()
        inside.close()
    migrate(AFTER)  # the migrations after 0005 (whose own locks wait for running writers)
    after = str(insert_outbox("after", created_at=database_now()).id)

    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers)).run_pass()

    written = {before, waited_for, *early_ids, after}
    assert len(written) == 4
    assert stats.published == 4 and unpublished_count() == 0
    assert _topic_copies(kafka.bootstrap_servers) == dict.fromkeys(written, 1)


def test_a_downgrade_then_an_upgrade_again_sends_only_what_was_not_published_once(
    before_0005: None, kafka: MockKafkaCluster
) -> None:
    migrate(AFTER)
    streamed = [str(insert_outbox(f"k{n}", created_at=database_now()).id) for n in range(3)]
    with as_relay():
        assert Relay(relay_settings(kafka.bootstrap_servers)).run_pass().published == 3
    waiting = str(insert_outbox("k0", created_at=database_now()).id)  # ahead of the position
    migrate(BEFORE)
    per_row = insert_per_row_design("k1")  # written while downgraded
    published_per_row = insert_per_row_design("k2", published=True)

    migrate(AFTER)
    fresh = str(insert_outbox("k1", created_at=database_now()).id)
    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers)).run_pass()

    assert stats.published == 3 and unpublished_count() == 0
    assert _topic_copies(kafka.bootstrap_servers) == dict.fromkeys(
        [*streamed, waiting, per_row, fresh], 1)
    assert published_per_row in {str(r["id"]) for r in outbox_state()}
    # Order per key across the round trip: k1's row written while downgraded, then the fresh one.
    order = first_seen_order(read_topic(kafka.bootstrap_servers))
    assert order["k1"] == [streamed[1], per_row, fresh]


def test_a_downgrade_while_slow_lane_rows_wait_keeps_them_waiting_and_an_upgrade_sends_them(
    before_0005: None, kafka: MockKafkaCluster
) -> None:
    """A refused row waiting for its retry, the row of its key held behind it, and a parked
    one: downgraded, the per-row design finds them unpublished with their attempts, error and
    retry time; upgraded again, they go out once due, in order per key."""
    migrate(AFTER)
    refused = insert_outbox("slow", created_at=database_now(),
                            payload='{"filler": "' + "x" * 1_200_000 + '"}')
    held = insert_outbox("slow", created_at=database_now(), seq=1)
    parked = insert_outbox("parked", created_at=database_now(), parked_at=database_now())
    delivered = insert_outbox("other", created_at=database_now())
    settings = relay_settings(kafka.bootstrap_servers, max_attempts=5,
                              backoff_initial=timedelta(hours=1), backoff_max=timedelta(hours=2))
    with as_relay():
        stats = Relay(settings).run_pass()
    assert (stats.published, stats.failed) == (1, 1)
    retry_at = {r["id"]: r["available_at"] for r in outbox_state()}[refused.id]
    assert retry_at is not None and retry_at > database_now()

    migrate(BEFORE)

    with connection.cursor() as cursor:
        cursor.execute("select id, published_at is not null, attempts, available_at,"
                       " parked_at is not null,"
                       " coalesce(last_error like 'MSG_SIZE_TOO_LARGE%%', false)"
                       " from outbox_messages")
        downgraded = {r[0]: r[1:] for r in cursor.fetchall()}
    assert downgraded == {
        refused.id: (False, 1, retry_at, False, True),
        held.id: (False, 0, None, False, False),
        parked.id: (False, 0, None, True, False),
        delivered.id: (True, 0, None, False, False),
    }

    migrate(AFTER)
    fix_payload(refused.id)
    with connection.cursor() as cursor:  # its retry is due (the hour has passed)
        cursor.execute("update outbox_messages set available_at = now() where id = %s",
                       [refused.id])
    with as_relay():
        stats = Relay(settings).run_pass()

    assert stats.published == 2
    state = {r["id"]: r for r in outbox_state()}
    assert state[parked.id]["parked_at"] is not None and state[parked.id]["published_at"] is None
    assert _topic_copies(kafka.bootstrap_servers) == dict.fromkeys(
        [str(delivered.id), str(refused.id), str(held.id)], 1)
    assert first_seen_order(read_topic(kafka.bootstrap_servers))["slow"] \
        == [str(refused.id), str(held.id)]
