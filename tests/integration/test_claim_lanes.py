"""Claims on two connections (REMINDER_CLAIM_CONNECTIONS=2, docs/design.md §3.8): the same
markers and events as on one, a failed batch retried while the other lane's commits, a stop or
the deadline with a batch in flight, a lost connection on either lane, the lane's connection
set up as the cycle's and closed at the end. A batch is held in flight by markers another
session has inserted and not committed (the claim waits on them), and released by rolling
them back; nothing here sleeps for a fixed time."""

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, cast

import psycopg
import pytest
from django.db import connection

from core.db import raw_connection
from reminders import store
from reminders.claim_connections import AliasConnections, AliasSession, SecondConnection
from reminders.models import ReminderRun
from tests.support.chaos import wait_until
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner, as_worker, test_database_url
from tests.support.factories import Documents
from tests.support.ledger import (
    AS_OF,
    events,
    expiring_in,
    forget_written,
    markers,
    outbox_refusing,
)

HELPER = "lanes-test-helper"  # the application name of this file's own sessions
DEADLINE_S = 30.0


def _session() -> psycopg.Connection[Any]:
    return psycopg.connect(test_database_url(), application_name=HELPER,
                           options="-c search_path=profile,public", autocommit=True)


@pytest.fixture
def watch() -> Iterator[psycopg.Connection[Any]]:
    """A superuser session of its own, to look at the others in pg_stat_activity."""
    with _session() as session:
        yield session


def _cycle_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("select pg_backend_pid()")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def _worker_sessions(watch: psycopg.Connection[Any], *, waiting: bool = False) -> list[int]:
    """The worker's sessions on the test database (the cycle's and any lane's)."""
    rows = watch.execute(
        "select pid from pg_stat_activity where datname = current_database()"
        " and application_name = %s and (not %s or wait_event_type = 'Lock') order by pid",
        (connection.settings_dict["OPTIONS"]["application_name"], waiting)).fetchall()
    return [int(r[0]) for r in rows]


def _lanes(watch: psycopg.Connection[Any], cycle_pid: int, *, waiting: bool = False) -> list[int]:
    return [pid for pid in _worker_sessions(watch, waiting=waiting) if pid != cycle_pid]


def _no_lane_left(watch: psycopg.Connection[Any], cycle_pid: int) -> None:
    wait_until(lambda: not _lanes(watch, cycle_pid), timeout=DEADLINE_S,
               what="the lane's connection closed")


@contextmanager
def held(*documents: Any) -> Iterator[Callable[[], None]]:
    """Markers of `documents` inserted by another session and not committed: a claim of them
    waits until the returned function rolls them back (or the block ends)."""
    session = psycopg.connect(test_database_url(), application_name=HELPER,
                              options="-c search_path=profile,public")
    try:
        for document in documents:
            session.execute(
                "insert into document_expiry_reminders (id, document_id, owner_user_id, type,"
                " threshold_days, expires_at, reminded_at, notified, run_id)"
                " select gen_random_uuid(), %s, %s, 'Passport', t, (%s at time zone 'UTC')::date,"
                " now(), true, gen_random_uuid() from unnest(array[0, 1, 7, 30]) as t",
                (document.id, document.owner_user_id, document.expires_at))
        yield session.rollback
    finally:
        session.rollback()
        session.close()


def _owners(*days: int, documents: Documents) -> list[Any]:
    """One document an owner, expiring in `days` (most urgent first: the order of batches)."""
    return [documents(expires_at=expiring_in(d)) for d in days]


def _notified_documents() -> list[str]:
    return sorted(d["documentId"] for e in events() for d in e["documents"])


def _outcome() -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
    """Every marker and every outbox row, as written (ids included: they are name-based)."""
    with connection.cursor() as cursor:
        cursor.execute("select document_id, owner_user_id, threshold_days, expires_at, notified"
                       " from document_expiry_reminders")
        written = {tuple(r) for r in cursor.fetchall()}
        cursor.execute("select id, aggregate_id, message_key, payload::text from outbox_messages")
        outbox = {tuple(r) for r in cursor.fetchall()}
    return written, outbox


def test_two_connections_write_what_one_writes(run: CycleRunner, documents: Documents) -> None:
    for i in range(40):  # owners of one to three documents spread over the window
        owner = uuid.uuid4()
        for j in range(1 + i % 3):
            documents(owner_user_id=owner, expires_at=expiring_in((i * 7 + j * 11) % 45 - 12))
    watch_pid = _cycle_pid()
    one = run(AS_OF, batch_size=4, claim_connections=1)
    on_one = _outcome()
    forget_written()

    two = run(AS_OF, batch_size=4, claim_connections=2)

    assert _outcome() == on_one
    assert one.counters() == two.counters() and two.status == ReminderRun.Status.SUCCEEDED
    assert two.owners_notified > 10 and two.documents_processed == one.documents_processed
    assert dict(two.reminders_by_threshold) == dict(one.reminders_by_threshold)
    with _session() as watch:
        _no_lane_left(watch, watch_pid)
    assert_outbox_matches_contract()


def test_the_dry_run_and_the_progress_on_two_connections(
    run: CycleRunner, documents: Documents
) -> None:
    _owners(*range(-3, 30, 3), documents=documents)
    seen: dict[int, list[tuple[int, int]]] = {1: [], 2: []}
    results = {n: run(AS_OF, batch_size=1, dry_run=True, claim_connections=n,
                      progress=lambda done, total, n=n: seen[n].append((done, total)))
               for n in (1, 2)}

    assert markers() == set() and events() == []
    assert results[2].owners_notified == results[1].owners_notified == 11
    assert dict(results[2].reminders_by_threshold) == dict(results[1].reminders_by_threshold)
    # once a batch, each counted once, up to every due document
    assert seen[2] == seen[1] == [(done, 11) for done in range(1, 12)]


def test_the_lane_connects_as_the_cycle_and_closes(
    transactional_db: None, watch: psycopg.Connection[Any]
) -> None:
    settings = ("select current_user, session_user, current_setting('statement_timeout'),"
                " current_setting('lock_timeout'),"
                " current_setting('idle_in_transaction_session_timeout'),"
                " current_setting('jit'), current_setting('search_path'),"
                " current_setting('application_name'), pg_backend_pid()")

    def probe(_owners: list[store.DueOwner]) -> store.BatchClaim:
        return cast(store.BatchClaim, raw_connection("default").execute(settings).fetchone())

    with as_worker():
        store.tune_claim_session("default")  # as store.due_owners tunes the cycle's session
        cycle = cast(tuple[Any, ...], probe([]))
        second = AliasConnections("default").second_session()
        with SecondConnection.open(second, probe) as lane:
            on_lane = cast(tuple[Any, ...], lane.send([]).result().result)
            assert _lanes(watch, cycle[-1]) == [on_lane[-1]]
        _no_lane_left(watch, cycle[-1])
        with connection.cursor() as cursor:
            cursor.execute("set jit = default")

    assert on_lane[:-1] == cycle[:-1]
    assert on_lane[0] == "pin_reminder_worker" and on_lane[5] == "off"
    assert on_lane[-1] != cycle[-1]


@pytest.mark.parametrize("failing_batch", ["lane", "cycle"])
def test_a_failed_batch_is_retried_owner_by_owner_while_the_other_lane_commits(
    run: CycleRunner, documents: Documents, watch: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture, failing_batch: str,
) -> None:
    # batch_size 2: batches of two owners; the 1st and 3rd go to the lane, the 2nd and 4th
    # are claimed on the cycle's connection meanwhile
    docs = _owners(1, 2, 3, 4, 5, 6, 8, 9, documents=documents)
    bad = docs[1] if failing_batch == "lane" else docs[3]
    cycle_pid = _cycle_pid()
    counted: list[int] = []
    with outbox_refusing(bad.owner_user_id), held(docs[0]) as release:
        def progress(done: int, _total: int) -> None:
            if not counted:
                # the cycle's batch is counted (retried first, when it failed) while the lane's
                # first batch cannot commit: it waits on a held marker until released here
                counted.append(done)
                wait_until(lambda: bool(_lanes(watch, cycle_pid, waiting=True)),
                           timeout=DEADLINE_S, what="the lane's batch waiting on the held marker")
                release()

        first = run(AS_OF, batch_size=2, claim_connections=2, progress=progress)

    assert counted == [1 if failing_batch == "cycle" else 2]  # the cycle's batch first
    assert (first.status, first.failed_owners, first.owners_notified) == ("partial", 1, 7)
    assert markers(bad.id) == set()
    assert _notified_documents() == sorted(str(d.id) for d in docs if d is not bad)
    assert [r.getMessage() for r in caplog.records].count(
        "batch failed, retrying owner by owner") == 1
    second = run(AS_OF, claim_connections=2)
    assert (second.status, second.owners_notified) == ("succeeded", 1)
    assert _notified_documents() == sorted(str(d.id) for d in docs)  # each once
    _no_lane_left(watch, cycle_pid)
    assert_outbox_matches_contract()


@pytest.mark.parametrize("ending", ["stop", "deadline"])
def test_a_stop_or_the_deadline_with_a_batch_in_flight_lets_it_commit_and_starts_no_other(
    run: CycleRunner, documents: Documents, watch: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture, ending: str,
) -> None:
    docs = _owners(1, 2, 3, 4, documents=documents)  # batches of one: the 1st to the lane
    cycle_pid = _cycle_pid()
    stop = threading.Event()
    now = [0.0]
    ended: list[int] = []

    with held(docs[0]) as release:
        def progress(done: int, _total: int) -> None:
            if ended:
                return
            ended.append(done)  # the cycle's batch is counted; the lane's waits on the markers
            wait_until(lambda: bool(_lanes(watch, cycle_pid, waiting=True)), timeout=DEADLINE_S,
                       what="the lane's batch waiting on the held markers")
            if ending == "stop":
                stop.set()
            else:
                now[0] = 3600.0
            release()  # the batch in flight goes on, after the stop (or the deadline)

        result = run(AS_OF, batch_size=1, claim_connections=2, stop=stop, progress=progress,
                     clock=lambda: now[0], max_run_duration=timedelta(seconds=60))

    status = ReminderRun.Status.STOPPED if ending == "stop" else ReminderRun.Status.TIMED_OUT
    assert (result.status, result.owners_notified, result.failed_owners) == (status, 2, 0)
    assert ended == [1]
    assert _notified_documents() == sorted(str(d.id) for d in docs[:2])  # the lane's committed
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("batch selected") == 2  # none after the stop or the deadline
    _no_lane_left(watch, cycle_pid)
    second = run(AS_OF, claim_connections=2)
    assert (second.status, second.owners_notified) == ("succeeded", 2)
    assert _notified_documents() == sorted(str(d.id) for d in docs)  # nothing twice, none lost
    assert_outbox_matches_contract()


@pytest.mark.parametrize("lost", ["lane", "cycle"])
def test_a_lost_connection_on_either_lane_fails_the_cycle_and_the_other_batch_is_accounted(
    run: CycleRunner, documents: Documents, watch: psycopg.Connection[Any], lost: str,
) -> None:
    docs = _owners(1, 2, 3, 4, documents=documents)  # the 1st to the lane, the 2nd the cycle's
    cycle_pid = _cycle_pid()
    problems: list[BaseException] = []

    with held(docs[0], docs[1]) as release:
        def terminate() -> None:
            try:
                # both batches in flight, each waiting on its held markers
                wait_until(lambda: len(_worker_sessions(watch, waiting=True)) == 2,
                           timeout=DEADLINE_S, what="both batches waiting on the held markers")
                [lane] = _lanes(watch, cycle_pid, waiting=True)
                watch.execute("select pg_terminate_backend(%s)",
                              (lane if lost == "lane" else cycle_pid,))
                wait_until(lambda: (lane if lost == "lane" else cycle_pid)
                           not in _worker_sessions(watch), timeout=DEADLINE_S,
                           what="the terminated session gone")
                release()  # the surviving batch commits
            except BaseException as exc:
                problems.append(exc)
                release()

        terminator = threading.Thread(target=terminate)
        terminator.start()
        result = run(AS_OF, batch_size=1, claim_connections=2)
        terminator.join(DEADLINE_S)

    assert not problems and not terminator.is_alive()
    assert (result.status, result.failed_owners, result.owners_notified) == ("failed", 1, 1)
    assert result.failure is not None and "database unreachable" in result.failure.reason
    survivor, gone = (docs[1], docs[0]) if lost == "lane" else (docs[0], docs[1])
    assert _notified_documents() == [str(survivor.id)]  # committed and accounted
    assert markers(gone.id) == set()  # the lost batch rolled back whole
    assert ReminderRun.objects.get(run_id=result.run_id).status == "failed"
    _no_lane_left(watch, cycle_pid if lost == "lane" else _cycle_pid())
    second = run(AS_OF, claim_connections=2)
    assert (second.status, second.owners_notified) == ("succeeded", 3)
    assert _notified_documents() == sorted(str(d.id) for d in docs)  # nothing twice, none lost
    assert_outbox_matches_contract()


def test_a_lane_that_cannot_connect_leaves_the_cycle_on_one_connection(
    run: CycleRunner, documents: Documents, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    docs = _owners(1, 2, 3, documents=documents)

    def refused(_session: AliasSession) -> None:
        raise psycopg.OperationalError("too many connections for role")

    monkeypatch.setattr(AliasSession, "connect", refused)
    cycle_pid = _cycle_pid()
    result = run(AS_OF, batch_size=1, claim_connections=2)

    assert (result.status, result.owners_notified) == ("succeeded", 3)
    assert _notified_documents() == sorted(str(d.id) for d in docs)
    assert "second claim connection unavailable, claiming on one" in caplog.messages
    with _session() as watch:
        _no_lane_left(watch, cycle_pid)
    assert_outbox_matches_contract()
