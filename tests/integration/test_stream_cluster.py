"""The stream's position and its cluster (migration 0006_stream_cluster), in process: a move is
made by giving the stored ids another cluster's identifier and values far ahead of this one's,
as a restore leaves them. Also: who may stamp a row's place, the functions under any
search_path, and a relay whose session changes under it."""

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection

from core.roles import RELAY_ROLE, WORKER_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from outbox import store
from outbox.relay import Relay
from tests.support.db_roles import test_database_url
from tests.support.relay_support import (
    BASE_TIME,
    as_relay,
    first_seen_order,
    insert_outbox,
    outbox_state,
    read_stream,
    relay_settings,
    unpublished_count,
)

# Far ahead of any test server's transaction counter: an old cluster that ran for years.
AHEAD = 5 << 32


def stored(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall()) if cursor.description else []


def this_system() -> int:
    return int(stored("select system_identifier from pg_control_system()")[0][0])


def position() -> dict[str, object]:
    with connection.cursor() as cursor:
        cursor.execute("select * from outbox_relay_position")
        names = [c.name for c in cursor.description]
        return dict(zip(names, cursor.fetchone(), strict=True))


@pytest.fixture(autouse=True)
def position_restored(transactional_db: None) -> Iterator[None]:
    """The position row outlives a test (the flush between tests empties only the model's
    tables): each test here gets it back as it found it."""
    [saved] = stored("select txid, seq, system_identifier, txid_offset from outbox_relay_position")
    yield
    stored("update outbox_relay_position set (txid, seq, system_identifier, txid_offset,"
           " previous_system_identifier, cluster_changed_at) = (%s, %s, %s, %s, null, null)",
           list(saved))


@pytest.fixture
def moved_here(transactional_db: None) -> Iterator[dict[str, list[str]]]:
    """An outbox as a dump of another cluster leaves it here: per key, one row the old relay
    delivered (behind the position) and one it had not (after it), all with that cluster's
    ids, which are far ahead of this cluster's; the ids per key in stream order."""
    keys = [str(uuid.uuid4()) for _ in range(3)]
    delivered = [insert_outbox(k, created_at=BASE_TIME) for k in keys]
    waiting = [insert_outbox(k, created_at=BASE_TIME + timedelta(seconds=1), seq=1)
               for k in keys]
    with connection.cursor() as cursor:
        cursor.execute("update outbox_messages set txid = (txid::text::numeric + %s)::text::xid8",
                       [AHEAD])
        cursor.execute("update outbox_relay_position p set system_identifier = 42,"
                       " (txid, seq) = (select m.txid, m.seq from outbox_messages m"
                       "                where m.id = any(%s) order by m.txid desc, m.seq desc"
                       "                limit 1)", [[r.id for r in delivered]])
        cursor.execute("insert into outbox_relay_batches (upto_txid, upto_seq, messages)"
                       " select txid, seq, 3 from outbox_relay_position")
    yield {k: [str(d.id), str(w.id)] for k, d, w in zip(keys, delivered, waiting, strict=True)}


def test_rows_written_after_a_move_come_after_everything_copied_and_all_are_delivered(
    moved_here: dict[str, list[str]], kafka: MockKafkaCluster
) -> None:
    later = {k: str(insert_outbox(k, created_at=BASE_TIME + timedelta(seconds=2), seq=2).id)
             for k in moved_here}  # the insert re-bases the stream first
    after_move = position()
    assert after_move["system_identifier"] == this_system()
    assert after_move["previous_system_identifier"] == 42
    assert int(str(after_move["txid_offset"])) > 0
    assert unpublished_count() == 6  # three copied ones waiting, three new ones

    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers)).run_pass()

    assert stats.published == 6 and unpublished_count() == 0
    records = read_topic(kafka.bootstrap_servers)
    assert first_seen_order(records) == {k: [ids[1], later[k]] for k, ids in moved_here.items()}


def test_the_relay_re_bases_a_moved_stream_no_writer_touched_yet_and_says_so(
    moved_here: dict[str, list[str]], kafka: MockKafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers)).run_pass()

    assert stats.published == 3  # the copied rows the old relay had not delivered
    assert [r.getMessage() for r in caplog.records if "moved to another cluster" in
            r.getMessage()] == ["outbox database moved to another cluster: stream re-based onto it"]
    assert position()["system_identifier"] == this_system()
    new = insert_outbox(next(iter(moved_here)), created_at=BASE_TIME + timedelta(seconds=3))
    with as_relay():
        assert Relay(relay_settings(kafka.bootstrap_servers)).run_pass().published == 1
    assert str(new.id) in {r.message_id for r in read_topic(kafka.bootstrap_servers)}


def test_a_move_to_a_cluster_whose_ids_are_already_past_the_stream_re_bases_nothing(
    transactional_db: None,
) -> None:
    stored("update outbox_relay_position set system_identifier = 42")  # ids behind this one's

    insert_outbox("k", created_at=BASE_TIME)

    after = position()
    assert (after["system_identifier"], after["previous_system_identifier"],
            after["txid_offset"]) == (this_system(), 42, 0)


def test_ids_ahead_on_the_same_cluster_are_refused_by_writers_and_by_the_relay(
    transactional_db: None, kafka: MockKafkaCluster
) -> None:
    insert_outbox("k", created_at=BASE_TIME)
    stored("update outbox_relay_position set txid = (txid::text::numeric + %s)::text::xid8",
           [AHEAD])  # an edit: the same cluster, its position far ahead of its ids

    with (pytest.raises(psycopg.Error, match="ahead of this cluster's transaction ids") as refused,
          psycopg.connect(test_database_url(WORKER_ROLE), autocommit=True) as worker):
        worker.execute("insert into profile.outbox_messages (id, aggregate_type, aggregate_id,"
                       " event_type, contract_version, topic, message_key, payload, headers,"
                       " created_at, attempts) values (gen_random_uuid(), 'Profile', 'k',"
                       " 'E', 1, 't', 'k', '{}', '{}', now(), 0)")
    assert refused.value.sqlstate == store.STREAM_AHEAD_SQLSTATE
    with as_relay(), pytest.raises(store.StreamAheadError, match="was edited"):
        Relay(relay_settings(kafka.bootstrap_servers)).run_pass()
    assert stored("select count(*) from outbox_messages") == [(1,)]


def test_no_writer_supplies_a_row_s_place_and_the_relay_cannot_move_one(
    transactional_db: None,
) -> None:
    columns = ("insert into profile.outbox_messages (id, aggregate_type, aggregate_id, event_type,"
               " contract_version, topic, message_key, payload, headers, created_at, attempts")
    values = " values (gen_random_uuid(), 'Profile', 'k', 'E', 1, 't', 'k', '{}', '{}', now(), 0"
    with psycopg.connect(test_database_url(WORKER_ROLE), autocommit=True) as worker:
        worker.execute(columns + ")" + values + ")")  # as the worker writes: allowed
        for column, value in (("txid", "'1'::xid8"), ("seq", "1")):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                worker.execute(f"{columns}, {column}) overriding system value{values}, {value})")
    with psycopg.connect(test_database_url(RELAY_ROLE), autocommit=True) as relay:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            relay.execute("update profile.outbox_messages set txid = txid")
        with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.GeneratedAlways)):
            relay.execute("update profile.outbox_messages set seq = seq")
    assert stored("select count(*) from outbox_messages") == [(1,)]


def test_the_outbox_functions_mean_the_same_whatever_the_caller_s_search_path(
    transactional_db: None,
) -> None:
    insert_outbox("k", created_at=BASE_TIME)
    with psycopg.connect(test_database_url(), autocommit=True) as other:
        other.execute("set search_path = public")
        assert other.execute("select profile.outbox_published_at(m) is null"
                             " from profile.outbox_messages m").fetchall() == [(True,)]
        other.execute("insert into profile.outbox_messages (id, aggregate_type, aggregate_id,"
                      " event_type, contract_version, topic, message_key, payload, headers,"
                      " created_at, attempts) values (gen_random_uuid(), 'Profile', 'k', 'E', 1,"
                      " 't', 'k', '{}', '{}', now(), 0)")
    assert len(outbox_state()) == 2


def test_a_relay_whose_statements_reach_another_server_process_refuses_to_move_the_stream(
    transactional_db: None,
) -> None:
    insert_outbox("k", created_at=BASE_TIME)
    with as_relay():
        start = store.read_position("default")
        pid = store.try_to_lead("default")
        assert pid is not None
        [row] = read_stream(batch_size=10, after=start)
        assert row.position is not None
        with pytest.raises(store.SessionChangedError, match="pool_mode=transaction"):
            store.advance("default", start=start, end=row.position, published=1, detours=[],
                          max_attempts=3, leader_pid=pid + 1)  # as after a pooler switched
        assert store.read_position("default") == start
        store.advance("default", start=start, end=row.position, published=1, detours=[],
                      max_attempts=3, leader_pid=pid)
        assert store.read_position("default") == row.position
        store.resign("default")


def test_a_transaction_writing_several_statements_sees_its_own_rows_behind_its_next_id(
    transactional_db: None,
) -> None:
    with psycopg.connect(test_database_url(WORKER_ROLE)) as worker:
        for _ in range(3):  # each statement's trigger sees the rows of the ones before
            worker.execute("insert into profile.outbox_messages (id, aggregate_type,"
                           " aggregate_id, event_type, contract_version, topic, message_key,"
                           " payload, headers, created_at, attempts) values (gen_random_uuid(),"
                           " 'Profile', 'k', 'E', 1, 't', 'k', '{}', '{}', now(), 0)")
        worker.commit()
    assert stored("select count(distinct txid) from outbox_messages") == [(1,)]
    assert stored("select count(*) from outbox_messages") == [(3,)]
