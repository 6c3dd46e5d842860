"""Migration 0005_stream_position on an outbox that has rows: an upgrade with a backlog loses
nothing and sends nothing twice, and a downgrade finds every published row published."""

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from core.db import apply_sql_file
from core.roles import ROLES_SQL
from devtools.mock_kafka import MockKafkaCluster
from devtools.topic import read_topic
from outbox.relay import Relay
from tests.support.ledger import database_now
from tests.support.relay_support import as_relay, insert_outbox, outbox_state, relay_settings

BEFORE = ("outbox", "0004_merge_0003_relay_claims_0003_requeue_permission")
# The newest outbox migration: 0005 and every one after it (the relay needs them all).
AFTER = ("outbox", "0006_stream_cluster")


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
