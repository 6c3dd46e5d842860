"""What the outbox refuses so that nothing lands where the relay cannot see it: a
writer's extra headers never replace the outbox's own; a row that arrives with its place in the
stream given, at or behind a position settled on this cluster, is refused even from an apply
worker; two writers settling a moved stream at once re-base it once; a one-shot pass that stood
by while rows waited names the session holding the relays' lock."""

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection

from core.roles import RELAY_ROLE, WORKER_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import read_topic
from outbox import store
from outbox.relay import Relay
from tests.acceptance.test_relay_process import relay_env, run_relay
from tests.support.db_roles import test_database_url
from tests.support.relay_support import (
    BASE_TIME,
    as_relay,
    first_seen_order,
    insert_outbox,
    relay_settings,
    unpublished_count,
    wait_for,
)

RESERVED = {"message_id": "forged", "correlation_id": "forged", "event_type": "forged",
            "contract_version": "forged", "aggregate_type": "forged", "aggregate_id": "forged"}
AHEAD = 5 << 32  # far ahead of this server's transaction ids: a cluster that ran for years
WORKER_INSERT = ("insert into profile.outbox_messages (id, aggregate_type, aggregate_id,"
                 " event_type, contract_version, topic, message_key, payload, headers,"
                 " created_at, attempts) values (%s, 'Profile', %s, %s, 1, %s, %s, %s,"
                 " profile.outbox_headers(%s, 'run', %s, 1, 'Profile', %s, %s), now(), 0)")


def stored(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall()) if cursor.description else []


@pytest.fixture(autouse=True)
def position_restored(transactional_db: None) -> Iterator[None]:
    """The position row outlives a test (the flush empties only the model's tables)."""
    [saved] = stored("select txid, seq, system_identifier, txid_offset from outbox_relay_position")
    yield
    stored("update outbox_relay_position set (txid, seq, system_identifier, txid_offset,"
           " previous_system_identifier, cluster_changed_at) = (%s, %s, %s, %s, null, null)",
           list(saved))


def worker_insert(conn: psycopg.Connection[Any], key: str, extra: dict[str, str]) -> uuid.UUID:
    """One outbox row as the worker writes it (headers by outbox_headers); its id."""
    row_id = uuid.uuid4()
    payload = {"ownerUserId": key, "remindedAt": "2026-11-29T03:00:00Z", "documents": [{
        "documentId": str(uuid.uuid4()), "type": "Passport", "numberMask": "45 ** ****12",
        "expiresAt": "2026-12-06", "thresholdDays": 7, "daysLeft": 7}]}
    conn.execute(WORKER_INSERT, [row_id, key, "DocumentExpiryReminderKafkaEvent",
                                 "pin.profile.document-expiry-reminders.v1", key,
                                 json.dumps(payload), row_id, "DocumentExpiryReminderKafkaEvent",
                                 key, json.dumps(extra)])
    return row_id


# --- reserved headers (item 6) -------------------------------------------------------------

def test_extra_headers_never_replace_the_outbox_s_own_and_the_topic_carries_the_row_s_id(
    kafka: MockKafkaCluster,
) -> None:
    with psycopg.connect(test_database_url(WORKER_ROLE), autocommit=True) as worker:
        seven = worker.execute("select profile.outbox_headers(%s, 'run', 'E', 1, 'Profile', 'o',"
                               " %s)", [uuid.UUID(int=1), json.dumps(
                                   {**RESERVED, "traceparent": "00-ab-cd-01"})]).fetchone()
        five = worker.execute("select profile.outbox_headers(%s, 'run', 'E', 1, %s)",
                              [uuid.UUID(int=2), json.dumps(RESERVED)]).fetchone()
        row_id = worker_insert(worker, "owner-1", {**RESERVED, "traceparent": "00-ab-cd-01"})
    assert seven is not None and five is not None
    # The CloudEvents headers are the outbox's too (tests/integration/test_cloudevents.py).
    assert {k: v for k, v in seven[0].items() if not k.startswith("ce_")} == {
        "message_id": str(uuid.UUID(int=1)), "correlation_id": "run", "event_type": "E",
        "contract_version": "1", "aggregate_type": "Profile", "aggregate_id": "o",
        "traceparent": "00-ab-cd-01", "content-type": "application/json"}
    assert (seven[0]["ce_id"], seven[0]["ce_subject"]) == (str(uuid.UUID(int=1)), "o")
    assert five[0] == {"message_id": str(uuid.UUID(int=2)), "correlation_id": "run",
                       "event_type": "E", "contract_version": "1"}

    with as_relay():
        assert Relay(relay_settings(kafka.bootstrap_servers)).run_pass().published == 1
    [record] = read_topic(kafka.bootstrap_servers)
    assert record.message_id == str(row_id)
    assert record.headers["aggregate_id"] == "owner-1"
    assert record.headers["event_type"] == "DocumentExpiryReminderKafkaEvent"
    assert record.headers["traceparent"] == "00-ab-cd-01"


# --- a row arriving behind the position (item 4) --------------------------------------------

def insert_placed(txid: str, *, replica: bool) -> None:
    """A row inserted with its place given, as the table owner; with `replica`, in an apply
    worker's mode (session_replication_role = replica: only ENABLE ALWAYS triggers fire)."""
    with psycopg.connect(test_database_url(), autocommit=True) as owner:
        if replica:
            owner.execute("set session_replication_role = replica")
        owner.execute("insert into profile.outbox_messages (id, aggregate_type, aggregate_id,"
                      " event_type, contract_version, topic, message_key, payload, headers,"
                      " created_at, attempts, txid, seq) overriding system value values"
                      " (gen_random_uuid(), 'Profile', 'k', 'E', 1, 't', 'k', '{}', '{}', now(),"
                      " 0, %s::xid8, 1)", [txid])


@pytest.mark.parametrize("replica", [False, True], ids=["by hand", "as an apply worker"])
def test_a_row_arriving_at_or_behind_the_position_is_refused_not_lost(replica: bool) -> None:
    insert_outbox("k", created_at=BASE_TIME)
    stored("update outbox_relay_position p set (txid, seq) = (select m.txid, m.seq"
           " from outbox_messages m order by m.txid desc, m.seq desc limit 1)")
    [(position,)] = stored("select txid::text from outbox_relay_position")

    for behind in ("1", position):
        with pytest.raises(psycopg.Error, match="at or behind the position") as refused:
            insert_placed(behind, replica=replica)
        assert refused.value.sqlstate == store.ROW_BEHIND_POSITION_SQLSTATE
    insert_placed(str(int(position) + 1), replica=replica)  # ahead of it: read next, accepted
    assert stored("select count(*) from outbox_messages") == [(2,)]
    if replica:  # a subscription still copying into a position of its publisher's: accepted
        stored("update outbox_relay_position set system_identifier = 42")
        insert_placed("1", replica=replica)
        assert stored("select count(*) from outbox_messages") == [(3,)]


# --- two writers settling a moved stream at once (item 7) -----------------------------------

def test_two_writers_settling_a_moved_stream_at_once_re_base_it_once_and_lose_nothing(
    kafka: MockKafkaCluster,
) -> None:
    keys = [str(uuid.uuid4()) for _ in range(2)]
    copied = {k: insert_outbox(k, created_at=BASE_TIME) for k in keys}
    stored("update outbox_messages set txid = (txid::text::numeric + %s)::text::xid8", [AHEAD])
    stored("update outbox_relay_position set system_identifier = 42")  # as a dump leaves it

    first = psycopg.connect(test_database_url(WORKER_ROLE))
    second = psycopg.connect(test_database_url(WORKER_ROLE))
    by_first: dict[str, uuid.UUID] = {}
    by_second: dict[str, uuid.UUID] = {}
    failures: list[BaseException] = []

    def second_writes() -> None:
        try:
            for key in keys:
                by_second[key] = worker_insert(second, key, {})
            second.commit()
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    try:
        # The second's transaction takes its id first: running when the first re-bases.
        second.execute("select pg_current_xact_id()")
        for key in keys:
            by_first[key] = worker_insert(first, key, {})  # re-bases, holds the position
        [(offset, changed_at)] = first.execute(
            "select txid_offset, cluster_changed_at from profile.outbox_relay_position"
        ).fetchall()
        thread = threading.Thread(target=second_writes)
        thread.start()
        wait_for(lambda: stored("select count(*) from pg_stat_activity where usename = %s"
                                " and wait_event_type = 'Lock' and datname = current_database()",
                                [WORKER_ROLE]) == [(1,)], what="the second writer waits")
        first.commit()
        thread.join(timeout=30)
        assert not thread.is_alive() and not failures, failures
    finally:
        first.close()
        second.close()

    after = stored("select txid_offset, cluster_changed_at, previous_system_identifier"
                   " from outbox_relay_position")
    assert after == [(offset, changed_at, 42)]  # set once, by the first
    assert offset > 0
    # Every row stamped here lies after every copied one (the second's too, whose transaction
    # was running when the first re-based), in the order of the writers' transaction ids.
    copied_ids = stored("select max(txid)::text from outbox_messages where id = any(%s)",
                        [[r.id for r in copied.values()]])[0][0]
    new_ids = stored("select min(txid)::text from outbox_messages where id <> all(%s)",
                     [[r.id for r in copied.values()]])[0][0]
    assert int(new_ids) > int(copied_ids)
    with as_relay():
        stats = Relay(relay_settings(kafka.bootstrap_servers)).run_pass()
    assert stats.published == 6 and unpublished_count() == 0
    assert first_seen_order(read_topic(kafka.bootstrap_servers)) == {
        k: [str(copied[k].id), str(by_second[k]), str(by_first[k])] for k in keys}


# --- a pass that stood by while rows waited (item 5) ----------------------------------------

@pytest.mark.parametrize("waiting_since", ["long ago", "just now"])
def test_a_pass_that_stood_by_while_rows_waited_exits_4_naming_the_lock_s_holder(
    kafka: MockKafkaCluster, waiting_since: str
) -> None:
    created = BASE_TIME if waiting_since == "long ago" else datetime.now(UTC)
    for n in range(3):
        insert_outbox(str(uuid.uuid4()), created_at=created + timedelta(milliseconds=n))
    # A session that took the lead and publishes nothing (as a pooled server connection keeps
    # a lock a relay took through a pooler by transaction).
    with psycopg.connect(test_database_url(RELAY_ROLE), autocommit=True,
                         application_name="pooled-connection") as holder:
        holder.execute("select pg_advisory_lock(%s)", [store.RELAY_LOCK])
        pid = holder.info.backend_pid
        done = run_relay(relay_env(kafka.bootstrap_servers), "--stood-by-bound", "5m")

    assert "stood by: another relay was publishing" in done.stdout
    assert unpublished_count() == 3
    if waiting_since == "just now":
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 4, done.stderr  # a person ends the session holding the lock
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("CommandError: 3 message(s) waiting, the oldest for "), last
    assert f"server process {pid} ({RELAY_ROLE}, from 127.0.0.1:" in last
    assert "idle for " in last and "'pooled-connection'" in last
    assert f"pg_terminate_backend({pid})" in last
