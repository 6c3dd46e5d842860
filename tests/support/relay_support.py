"""Relay test support: a mock Kafka cluster per test, outbox rows written directly, the relay
under its least-privilege role, reading a topic back, and waiting on conditions."""

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, connections

from core.roles import RELAY_ROLE
from devtools.mock_kafka import MockKafkaCluster
from devtools.read_topic import Record
from outbox import store
from outbox.config import RelaySettings
from outbox.lanes import ReadSize, StreamReader
from outbox.relay import Relay, Wakeup
from reminders import events
from tests.support.contract import assert_event_valid
from tests.support.db_roles import as_role, test_database_url

TOPIC = events.TOPIC
BASE_TIME = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
HOLD_LOCK = 4_242_001


@pytest.fixture
def kafka() -> Iterator[MockKafkaCluster]:
    """A fresh mock cluster (3 brokers) per test, so topics never leak between tests."""
    with MockKafkaCluster(3) as cluster:
        yield cluster


def relay_settings(bootstrap: str, **overrides: Any) -> RelaySettings:
    """Settings for tests: short timeouts, small backoff."""
    base = RelaySettings(
        bootstrap_servers=bootstrap,
        batch_size=100,
        poll_interval=timedelta(milliseconds=200),
        delivery_timeout=timedelta(seconds=5),
        shutdown_grace=timedelta(seconds=2),
        backoff_initial=timedelta(milliseconds=50),
        backoff_max=timedelta(milliseconds=400),
        linger=timedelta(milliseconds=2),
        # The stand-ins are one broker (Tansu: one copy of each record); the check of the
        # topic's durability is tested on its own (tests/integration/test_relay_topic.py).
        allow_undurable_topic=True,
    )
    return base.with_overrides(**overrides)


def read_stream(*, batch_size: int, after: store.Position) -> list[store.ReadMessage]:
    """The stream's rows after `after` as the relay's reader reads them (on its own session,
    in the role of this thread's connection); nothing is written."""
    reader = StreamReader("default", ReadSize.up_to(batch_size))
    try:
        return reader.read(after).messages
    finally:
        reader.close()


def as_relay() -> AbstractContextManager[None]:
    """Run the block's queries (this thread's connection) as the relay's role."""
    return as_role(RELAY_ROLE)


def event_payload(owner: str, seq: int) -> dict[str, Any]:
    """A contract-valid event body for `owner`; `seq` varies the document."""
    return {
        "ownerUserId": owner,
        "remindedAt": "2026-11-29T03:00:00Z",
        "documents": [{
            "documentId": str(uuid.UUID(int=seq + 1, version=4)),
            "type": "Passport",
            "numberMask": f"45 ** ****{seq % 100:02d}",
            "expiresAt": "2026-12-06",
            "thresholdDays": 7,
            "daysLeft": 7,
        }],
    }


@dataclass(frozen=True)
class Row:
    id: uuid.UUID
    key: str
    created_at: datetime


def insert_outbox(
    key: str,
    *,
    created_at: datetime,
    payload: dict[str, Any] | str | None = None,
    seq: int = 0,
    published_at: datetime | None = None,
    parked_at: datetime | None = None,
    topic: str = TOPIC,
) -> Row:
    """One outbox row, written as the table owner (as the worker would, plus relay state). A
    published or parked one is a slow-lane row (detoured), as the relay leaves such a row;
    any other is in the stream, ahead of the relay's position."""
    row_id = uuid.uuid4()
    body = payload if payload is not None else event_payload(key, seq)
    headers = {"message_id": str(row_id), "correlation_id": str(uuid.uuid4()),
               "event_type": events.EVENT_TYPE, "contract_version": str(events.CONTRACT_VERSION)}
    with connection.cursor() as cursor:
        cursor.execute(
            "insert into outbox_messages (id, aggregate_type, aggregate_id, event_type,"
            " contract_version, topic, message_key, payload, headers, created_at, published_at,"
            " parked_at, detoured_at, attempts)"
            " values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0)",
            [row_id, events.AGGREGATE_TYPE, key, events.EVENT_TYPE, events.CONTRACT_VERSION,
             topic, key, body if isinstance(body, str) else json.dumps(body),
             json.dumps(headers), created_at, published_at, parked_at,
             published_at or parked_at],
        )
    return Row(row_id, key, created_at)


@dataclass(frozen=True)
class StoredRow:
    """An outbox row as the table owner reads it: what the relay must send."""

    id: str
    key: str
    payload: Any
    headers: dict[str, str]
    created_at: datetime


def stored_rows() -> dict[str, StoredRow]:
    """Every outbox row by message id, in the stream's order."""
    with connection.cursor() as cursor:
        cursor.execute("select id::text, message_key, payload::text, headers::text, created_at"
                       " from outbox_messages order by txid, seq")
        return {r[0]: StoredRow(r[0], r[1], json.loads(r[2]), json.loads(r[3]), r[4])
                for r in cursor.fetchall()}


def assert_sent_as_stored(record: Record, row: StoredRow) -> None:
    """`record` is `row` as the contract sends it: keyed by the owner, the payload (valid by the
    contract) as its value, every stored header (the aggregate's with them, outbox migration
    0010) and nothing else, stamped with the row's created_at."""
    body = record.json()
    assert_event_valid(body)
    assert body == row.payload
    assert record.key == row.key == body["ownerUserId"]
    assert (row.headers["aggregate_type"], row.headers["aggregate_id"]) == (
        events.AGGREGATE_TYPE, row.key)
    assert record.headers == row.headers
    assert record.headers["message_id"] == row.id
    assert record.headers["event_type"] == events.EVENT_TYPE
    assert record.headers["contract_version"] == str(events.CONTRACT_VERSION)
    assert record.timestamp_ms == int(row.created_at.timestamp() * 1000)


def interleaved_rows(keys: int, per_key: int, *, topic: str = TOPIC) -> dict[str, list[uuid.UUID]]:
    """`per_key` rows for each of `keys` owners, written round-robin (1st of every key, then
    2nd, ...), with distinct increasing created_at; message ids per key in written order."""
    owners = [str(uuid.uuid4()) for _ in range(keys)]
    written: dict[str, list[uuid.UUID]] = {o: [] for o in owners}
    seq = 0
    for round_ in range(per_key):
        for owner in owners:
            seq += 1
            row = insert_outbox(owner, created_at=BASE_TIME + timedelta(milliseconds=seq),
                                seq=round_, topic=topic)
            written[owner].append(row.id)
    return written


def bulk_rows(keys: int, per_key: int, *, topic: str = TOPIC) -> dict[str, list[uuid.UUID]]:
    """As interleaved_rows, in one statement (thousands of rows in a moment)."""
    owners = [str(uuid.uuid4()) for _ in range(keys)]
    written: dict[str, list[uuid.UUID]] = {o: [] for o in owners}
    ids, keys_, bodies, headers, created = [], [], [], [], []
    for seq, (round_, owner) in enumerate(
            ((r, o) for r in range(per_key) for o in owners), start=1):
        row_id = uuid.uuid4()
        written[owner].append(row_id)
        ids.append(row_id)
        keys_.append(owner)
        bodies.append(json.dumps(event_payload(owner, round_)))
        headers.append(json.dumps({"message_id": str(row_id), "event_type": events.EVENT_TYPE,
                                   "contract_version": str(events.CONTRACT_VERSION),
                                   "correlation_id": str(uuid.uuid4())}))
        created.append(BASE_TIME + timedelta(milliseconds=seq))
    with connection.cursor() as cursor:
        cursor.execute(
            "insert into outbox_messages (id, aggregate_type, aggregate_id, event_type,"
            " contract_version, topic, message_key, payload, headers, created_at)"
            " select i, %s, k, %s, %s, %s, k, p, h, c from unnest(%s::uuid[], %s::text[],"
            " %s::jsonb[], %s::jsonb[], %s::timestamptz[]) as t(i, k, p, h, c)",
            [events.AGGREGATE_TYPE, events.EVENT_TYPE, events.CONTRACT_VERSION, topic,
             ids, keys_, bodies, headers, created])
    return written


def written_order(written: dict[str, list[uuid.UUID]]) -> dict[str, list[str]]:
    """Message ids per key in written order, as first_seen_order reports them."""
    return {key: [str(i) for i in ids] for key, ids in written.items()}


@contextmanager
def marking_held() -> Iterator[psycopg.Connection[Any]]:
    """While inside, a relay that records delivered rows blocks (on an advisory lock this
    connection holds), after Kafka acknowledged them: the window between produce and record
    (the stream's position, or a slow-lane row's published_at)."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute(f"""
            create function hold_outbox_mark() returns trigger language plpgsql as $$
            begin
                perform pg_advisory_xact_lock({HOLD_LOCK});
                return new;
            end $$;
            create trigger hold_outbox_mark before update on outbox_messages for each row
                when (old.published_at is null and new.published_at is not null)
                execute function hold_outbox_mark();
            create trigger hold_outbox_position before update on outbox_relay_position
                for each row execute function hold_outbox_mark();""")
    holder = psycopg.connect(test_database_url(), autocommit=True)
    holder.execute("select pg_advisory_lock(%s)", [HOLD_LOCK])
    try:
        yield holder
    finally:
        holder.close()  # releases the lock
        with connection.cursor() as cursor:
            cursor.execute("drop trigger if exists hold_outbox_mark on outbox_messages;"
                           " drop trigger if exists hold_outbox_position on outbox_relay_position;"
                           " drop function if exists hold_outbox_mark()")


def relay_lock_holders() -> list[int]:
    """The sessions holding the relays' advisory lock on the test database (at most one)."""
    with connection.cursor() as cursor:
        cursor.execute("select pid from pg_locks where locktype = 'advisory' and granted"
                       " and database = (select oid from pg_database"
                       "                 where datname = current_database())"
                       " and classid = %s and objid = %s and objsubid = 1",
                       [store.RELAY_LOCK >> 32, store.RELAY_LOCK & 0xFFFF_FFFF])
        return [int(r[0]) for r in cursor.fetchall()]


def outbox_state() -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "select id, message_key, outbox_published_at(m) as published_at, parked_at, attempts,"
            " last_error, available_at, detoured_at"
            " from outbox_messages m order by created_at, id")
        names = [c.name for c in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def published_ids() -> set[str]:
    """The ids of the rows recorded as published (either lane)."""
    with connection.cursor() as cursor:
        cursor.execute("select id::text from outbox_messages m"
                       " where outbox_published_at(m) is not null")
        return {r[0] for r in cursor.fetchall()}


def detoured_count() -> int:
    """How many rows left the stream for the slow lane."""
    with connection.cursor() as cursor:
        cursor.execute("select count(*) from outbox_messages where detoured_at is not null")
        return int(cursor.fetchone()[0])


def unpublished_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute("select count(*) from outbox_messages m"
                       " where outbox_published_at(m) is null")
        return int(cursor.fetchone()[0])


def wait_for(condition: Callable[[], bool], *, timeout: float = 30.0, what: str = "condition",
             interval: float = 0.05) -> None:
    """Poll `condition` until it holds, failing the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def first_seen_order(records: list[Record]) -> dict[str, list[str]]:
    """Per key, message ids in the order they were first read from their partition."""
    order: dict[str, list[str]] = {}
    seen: set[str] = set()
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        if record.message_id not in seen:
            seen.add(record.message_id)
            order.setdefault(record.key, []).append(record.message_id)
    return order


class RelayThread(threading.Thread):
    """A relay running `run_loop` in its own thread, with its own connection, as the relay role."""

    def __init__(self, settings: RelaySettings, *, wakeup: Wakeup | None = None,
                 **relay_options: Any) -> None:
        super().__init__(daemon=True)
        self.relay = Relay(settings, **relay_options)
        self.wakeup = wakeup
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with as_relay():
                self.relay.run_loop(self.wakeup)
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()

    def stop_and_join(self, timeout: float = 30.0) -> None:
        self.relay.stop.set()
        self.join(timeout)
        assert not self.is_alive(), "relay thread did not stop"
        if self.error is not None:
            raise self.error


def standby_takeover(settings: RelaySettings, *, topic: str = TOPIC) -> dict[str, list[uuid.UUID]]:
    """Two relays on `settings`: the first leads and publishes 120 rows (30 owners, 4 each)
    while the second stands by; the leader's session is ended (pg_terminate_backend; its
    backoff after that lasts until the end), and the standby takes over and publishes 120
    more, the first sending nothing more (asserted). The rows' message ids per owner, in
    written order, for the caller to check the topic against."""
    resume = threading.Event()
    first = RelayThread(settings, relay_id="relay-1", wait=lambda _delay: resume.wait(60))
    second = RelayThread(settings, relay_id="relay-2")
    first.start()
    wait_for(lambda: bool(relay_lock_holders()), timeout=30, what="the first relay to lead")
    second.start()
    try:
        before = interleaved_rows(keys=30, per_key=4, topic=topic)
        wait_for(lambda: unpublished_count() == 0, timeout=60, what="every row published")
        assert (first.relay.stats.published, second.relay.stats.published) == (120, 0)
        [leader_pid] = relay_lock_holders()
        with connection.cursor() as cursor:
            cursor.execute("select pg_terminate_backend(%s)", [leader_pid])
        after = interleaved_rows(keys=30, per_key=4, topic=topic)
        wait_for(lambda: unpublished_count() == 0, timeout=60, what="the standby to publish")
        assert second.relay.stats.published == 120  # the standby took over
        assert first.relay.stats.published == 120  # the first relay sent nothing more
    finally:
        resume.set()
        for relay in (first, second):
            relay.stop_and_join()
    return {**before, **after}
