"""The only module of the relay that talks to the database: each function runs one named query
of `sql/queries.sql` in its own short transaction (autocommit; `advance` runs three in one), so
that no transaction is ever open across a Kafka call."""

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from django.db import transaction

from core.db import one, raw_connection, server_cursor
from core.queries import QueryFile

QUERIES_FILE = Path(__file__).parent / "sql" / "queries.sql"
QUERIES = QueryFile(QUERIES_FILE)

# A place in the stream: the writer transaction's id (xid8, as text) and the row's seq.
Position = tuple[str, int]


class ReadMessage(NamedTuple):
    """A deliverable outbox row, as the producer needs it (the payload and headers stay opaque
    text), in the columns of the queries read_stream and read_slow: a plain tuple, for a read
    makes thousands of them a batch."""

    # In the stream: the row's place. None for a slow-lane row.
    txid: str | None
    seq: int | None
    id: str  # the message id, as text (uuid.UUID(id) where one is needed)
    topic: str
    key: str
    payload: str
    # The Kafka headers, a JSON object: the row's (message id, event type, contract version,
    # correlation id, traceparent when present) and the aggregate's type and id.
    headers: str
    timestamp_ms: int  # the row's created_at, the Kafka timestamp
    # The database's clock (which stamped created_at) when the read ran, seconds since the epoch.
    clock_s: float
    # A stream row whose key is held behind the slow lane (such a row is detoured, not sent).
    held: bool
    attempts: int

    @property
    def position(self) -> Position | None:
        return None if self.txid is None or self.seq is None else (self.txid, self.seq)


@dataclass(frozen=True, slots=True)
class Read:
    """The rows of one read, and when it returned on this process's monotonic clock: with a
    row's age at the read, its age at any later moment without the relay's wall clock."""

    messages: list[ReadMessage]
    read_at: float


@dataclass(frozen=True, slots=True)
class Failure:
    """A message-level delivery failure to record: the error, and when to try again."""

    id: str  # the message id, as read
    error: str
    retry_in: timedelta


@dataclass(frozen=True, slots=True)
class Detour:
    """A stream row that leaves the stream for the slow lane: a failed delivery (its error and
    retry delay), a row its partition could not take now (its error and retry delay, no attempt
    counted: `attempted` false), a row held behind its key's head (no error: no attempt), or a
    row the relay does not send (`park`: its topic is not on OUTBOX_TOPICS; parked at once with
    its error, no attempt counted)."""

    id: str  # the message id, as read
    error: str | None = None
    retry_in: timedelta = timedelta(0)
    attempted: bool = True  # with an error: count it as an attempt (a partition's outage: not)
    park: bool = False


class PositionMovedError(RuntimeError):
    """The stream's position was not where this relay read it: another relay moved it."""


class StreamAheadError(RuntimeError):
    """The stream's stored transaction ids are ahead of the cluster they were stamped on (an
    edited position or txid): the relay refuses to guess which rows went out."""


class SessionChangedError(RuntimeError):
    """The relay's statements reach another server process than the one that took the lead:
    a pooler by transaction (PgBouncer pool_mode=transaction) is in the way."""


class StreamSubscribedError(RuntimeError):
    """The database moved to this cluster while a logical-replication subscription still
    applies the outbox to it: the stream is not re-based under the rows still coming."""


class ServerInRecoveryError(RuntimeError):
    """The relay's database server is in recovery (a hot standby, a restore under way): the
    relay publishes only on the primary it leads on."""


class ReaderOnAnotherServerError(RuntimeError):
    """The relay's reader reached another server than the one the relay leads on (a failover
    window, a virtual address that moved): what it reads there is not what the position
    covers."""


# Raised by outbox_stream_settle() (migrations 0006_stream_cluster, 0013_stream_guards).
STREAM_AHEAD_SQLSTATE = "OB001"
STREAM_SUBSCRIBED_SQLSTATE = "OB004"
# Raised by the trigger outbox_messages_behind_position (migration 0013_stream_guards).
ROW_BEHIND_POSITION_SQLSTATE = "OB005"


@dataclass(frozen=True, slots=True)
class Server:
    """The PostgreSQL server a session reached: its cluster, when its postmaster started (a
    promoted standby shares its primary's cluster id, never its start), whether it is in
    recovery, and where (for the messages)."""

    system_identifier: int
    started_at: datetime
    in_recovery: bool
    address: str

    def is_the_same_primary_as(self, other: "Server") -> bool:
        """Both sessions reach one primary server (the leader's reads and writes agree)."""
        return (self.system_identifier == other.system_identifier
                and self.started_at == other.started_at
                and not self.in_recovery and not other.in_recovery)

    def __str__(self) -> str:
        return (f"{self.address} (cluster {self.system_identifier}, up since "
                f"{self.started_at.isoformat(timespec='seconds')}"
                f"{', in recovery' if self.in_recovery else ''})")


@dataclass(frozen=True, slots=True)
class Lead:
    """One look for the relays' lock: taken or not, the server process that looked, and the
    server it reached (never taken on a server in recovery)."""

    taken: bool
    pid: int
    server: Server


@dataclass(frozen=True, slots=True)
class LockHolder:
    """The session holding the relays' lock, as far as this role may see it (pg_stat_activity
    shows another role's client address and state only to pg_read_all_stats)."""

    pid: int
    user: str | None
    client_addr: str | None
    client_port: int | None
    application_name: str | None
    state: str | None
    idle_for_s: float | None

    def __str__(self) -> str:
        where = (f"{self.client_addr}:{self.client_port}" if self.client_addr
                 else "a local socket" if self.client_port == -1
                 else "an address this role may not see")
        state = ("state not visible to this role" if self.state is None
                 else f"idle for {self.idle_for_s:.0f}s" if self.state == "idle"
                 and self.idle_for_s is not None
                 else self.state)
        return (f"server process {self.pid} ({self.user or 'another role'}, from {where}, "
                f"{state}"
                f"{f', application {self.application_name!r}' if self.application_name else ''})")


@dataclass(frozen=True, slots=True)
class Settlement:
    """What settle_stream found: whether the database had moved to another cluster since the
    stream last looked, and whether the stream was re-based onto it."""

    txid_offset: int
    rebased: bool
    moved: bool
    recorded_system: int
    this_system: int


@dataclass(frozen=True, slots=True)
class StreamCluster:
    """The stream's cluster, read only (query `stream_cluster`)."""

    recorded_system: int
    this_system: int
    newest_txid: str  # the newest id stored (a row's or the position's), in the stream's ids
    next_txid: str  # this cluster's next transaction id, in the stream's ids
    txid_offset: int
    previous_system: int | None
    changed_at: datetime | None

    @property
    def ahead(self) -> bool:
        """Stored ids at or past this cluster's next one: rows written here would sort behind."""
        return int(self.newest_txid) >= int(self.next_txid)


@dataclass(frozen=True, slots=True)
class Backlog:
    """The outbox backlog (query `outbox_backlog`): messages waiting for the relay, parked
    ones apart, and the oldest waiting one."""

    unpublished: int
    parked: int
    oldest_created_at: datetime | None
    oldest_age_s: float | None


@dataclass(frozen=True, slots=True)
class ParkedMessage:
    id: uuid.UUID
    message_key: str
    event_type: str
    attempts: int
    parked_at: datetime
    last_error: str | None
    blocked_behind: int


def relax_commit_durability(using: str) -> psycopg.Connection[Any]:
    """Let this session commit without waiting for the WAL flush; the connection it applies to."""
    conn = raw_connection(using)
    with psycopg.Cursor(conn) as cur:
        cur.execute(QUERIES["relax_commit_durability"])
    return conn


# The relays' session advisory lock: the one relay holding it publishes, the others stand by.
RELAY_LOCK = 7_203_100_001

def look_for_the_lead(using: str) -> Lead:
    """Take the relays' lock for this database session, without waiting, unless its server is
    in recovery; what was found."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["try_to_lead"], {"lock": RELAY_LOCK})
        taken, pid, system, started_at, in_recovery = one(cur)
    return Lead(bool(taken), int(pid),
                Server(int(system), started_at, bool(in_recovery), _address(cur.connection)))


def try_to_lead(using: str) -> int | None:
    """Take the relays' lock for this database session, without waiting: the server process
    that holds it if taken (advance checks it), None if another relay holds it (or the server
    is in recovery)."""
    lead = look_for_the_lead(using)
    return lead.pid if lead.taken else None


def server_of(conn: psycopg.Connection[Any]) -> Server:
    """The server a session reached."""
    with psycopg.Cursor(conn) as cur:
        cur.execute(QUERIES["server_identity"])
        system, started_at, in_recovery = one(cur)
    return Server(int(system), started_at, bool(in_recovery), _address(conn))


def session_server(using: str) -> Server:
    """The server the alias's session reached."""
    return server_of(raw_connection(using))


def _address(conn: psycopg.Connection[Any]) -> str:
    """host:port/database of a session, as the client reached it."""
    info = conn.info
    return f"{info.host}:{info.port}/{info.dbname}"


def relay_lock_holder(using: str) -> LockHolder | None:
    """The session holding the relays' lock on this database (None: nobody holds it now)."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["relay_lock_holder"], {"lock": RELAY_LOCK})
        row = cur.fetchone()
    return None if row is None else LockHolder(*row)


def settle_stream(using: str) -> Settlement:
    """Check that the stream's ids belong to this cluster, re-basing it onto a new one the
    database moved to (docs/outbox-relay.md, "The stream on a new cluster"); raises
    StreamAheadError when the same cluster's stored ids are ahead of its own."""
    try:
        with server_cursor(using) as cur:
            cur.execute(QUERIES["settle_stream"])
            return Settlement(*one(cur))
    except psycopg.Error as exc:
        if exc.sqlstate == STREAM_AHEAD_SQLSTATE:
            raise StreamAheadError(exc.diag.message_primary or str(exc)) from None
        if exc.sqlstate == STREAM_SUBSCRIBED_SQLSTATE:
            raise StreamSubscribedError(exc.diag.message_primary or str(exc)) from None
        raise


def stream_cluster(using: str) -> StreamCluster:
    """The stream's cluster as it stands (read only: nothing is re-based)."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["stream_cluster"])
        recorded, this, newest, next_txid, offset, previous, changed_at = one(cur)
    return StreamCluster(int(recorded), int(this), str(newest), str(next_txid), int(offset),
                         previous, changed_at)


def resign(using: str) -> None:
    """Release the relays' lock held by this database session."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["resign"], {"lock": RELAY_LOCK})


def read_position(using: str) -> Position:
    """Where the stream has been delivered up to."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["read_position"])
        txid, seq = one(cur)
    return str(txid), int(seq)


def read_stream(conn: psycopg.Connection[Any], *, batch_size: int, after: Position) -> Read:
    """Up to `batch_size` rows after `after` in stream order, of settled transactions only, on
    the given session (the relay's reader has one of its own); nothing is written."""
    with psycopg.Cursor(conn) as cur:
        cur.execute(QUERIES["read_stream"], {"batch_size": batch_size,
                                             "after_txid": after[0], "after_seq": after[1]},
                    binary=True)
        rows = list(map(ReadMessage._make, cur.fetchall()))
    return Read(rows, time.monotonic())


def stream_waiting(using: str, after: Position) -> bool:
    """Are there stream rows after `after` that a read could not take yet (a transaction
    older than theirs is still open)?"""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["stream_waiting"], {"after_txid": after[0], "after_seq": after[1]})
        return bool(one(cur)[0])


def read_slow(using: str, *, batch_size: int) -> Read:
    """Up to `batch_size` due slow-lane rows, per key only its oldest waiting one."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["read_slow"], {"batch_size": batch_size}, binary=True)
        rows = cur.fetchall()
    return Read(list(map(ReadMessage._make, rows)), time.monotonic())


def advance(using: str, *, start: Position, end: Position, published: int,
            detours: Sequence[Detour], max_attempts: int, leader_pid: int) -> list[uuid.UUID]:
    """In one transaction: move the position from `start` to `end`, record the batch, and move
    its `detours` to the slow lane; the ids that got parked. Changes nothing, and raises
    PositionMovedError when the position was not at `start`, SessionChangedError when this is
    not the session (`leader_pid`) that took the lead, StreamAheadError when `end` lies ahead
    of this cluster's transaction ids."""
    positions = {"from_txid": start[0], "from_seq": start[1], "upto_txid": end[0],
                 "upto_seq": end[1], "leader_pid": leader_pid}
    with transaction.atomic(using=using, durable=True), server_cursor(using) as cur:
        cur.execute(QUERIES["advance_position"], positions)
        moved = cur.fetchone()
        if moved is None:
            cur.execute(QUERIES["advance_refused"], positions)
            _in_place, same_session, behind_horizon = one(cur)
            if not same_session:
                raise SessionChangedError(
                    f"the relay took the lead on server process {leader_pid} and now reaches "
                    "another one: a connection pooler that pools by transaction "
                    "(PgBouncer pool_mode=transaction) is between the relay and PostgreSQL; "
                    "connect the relay directly or through session pooling")
            if not behind_horizon:
                raise StreamAheadError(f"the batch's end {end} lies ahead of this cluster's "
                                       "transaction ids")
            raise PositionMovedError(f"the stream's position is not at {start} any more")
        cur.execute(QUERIES["record_batch"], {"upto_txid": end[0], "upto_seq": end[1],
                                              "published_at": moved[0], "messages": published})
        if not detours:
            return []
        cur.execute(QUERIES["detour"], {
            "ids": [d.id for d in detours],
            "attempted": [d.error is not None and d.attempted and not d.park for d in detours],
            "errors": [None if d.error is None else d.error[:2000] for d in detours],
            "retry_in": [d.retry_in for d in detours],
            "park": [d.park for d in detours],
            "max_attempts": max_attempts,
        })
        return [r[0] for r in cur.fetchall() if r[1]]


def mark_published(using: str, ids: Sequence[str]) -> int:
    """Record delivered slow-lane rows; the number marked (a row another relay already marked is skipped)."""
    if not ids:
        return 0
    with server_cursor(using) as cur:
        cur.execute(QUERIES["mark_published"], {"ids": list(ids)})
        return cur.rowcount


def record_failures(using: str, failures: Sequence[Failure], max_attempts: int) -> list[uuid.UUID]:
    """Count a failed attempt per slow-lane row and delay its retry; the ids that got parked."""
    if not failures:
        return []
    with server_cursor(using) as cur:
        cur.execute(
            QUERIES["record_failures"],
            {
                "ids": [f.id for f in failures],
                "errors": [f.error[:2000] for f in failures],
                "retry_in": [f.retry_in for f in failures],
                "max_attempts": max_attempts,
            },
        )
        return [r[0] for r in cur.fetchall() if r[1]]


def park(using: str, errors: Mapping[str, str]) -> list[uuid.UUID]:
    """Park slow-lane rows the relay does not send (id: why), no attempt counted; the ids
    parked."""
    if not errors:
        return []
    with server_cursor(using) as cur:
        cur.execute(QUERIES["park"], {"ids": list(errors),
                                      "errors": [e[:2000] for e in errors.values()]})
        return [r[0] for r in cur.fetchall()]


def prune_published(using: str, retention: timedelta, chunk: int) -> int:
    """Delete a chunk of rows published longer than `retention` ago (up to `chunk` of the
    stream's and up to `chunk` of the slow lane's); the number deleted."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["prune_published"], {"retention": retention, "chunk": chunk})
        return int(one(cur)[0])


def prune_batches(using: str, retention: timedelta) -> int:
    """Forget the batches older than `retention` that no stream row is behind any more."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["prune_batches"], {"retention": retention})
        return cur.rowcount


@dataclass(frozen=True, slots=True)
class TopicPartitions:
    """What recording a topic's partition count found: the count before, if it changed now,
    and when a relay last found it changed (seconds since the epoch), if ever."""

    previous: int | None
    changed_at_s: float | None


def record_topic_partitions(using: str, topic: str, partitions: int) -> TopicPartitions:
    """Record `topic`'s partition count as seen now (migration 0011_topic_partitions)."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["record_topic_partitions"], {"topic": topic, "partitions": partitions})
        previous, changed_at_s = one(cur)
    return TopicPartitions(previous, changed_at_s)


def list_parked(using: str, limit: int) -> list[ParkedMessage]:
    with server_cursor(using) as cur:
        cur.execute(QUERIES["list_parked"], {"limit": limit})
        return [ParkedMessage(*r) for r in cur.fetchall()]


class ParkedRow(NamedTuple):
    """A parked row as a re-queue's preview shows it."""

    id: uuid.UUID
    message_key: str
    created_at: datetime
    parked_at: datetime


def requeue_preview(using: str, ids: Sequence[uuid.UUID] | None) -> list[ParkedRow]:
    """The parked rows `requeue_parked(ids)` would re-queue, oldest parked first."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["requeue_preview"], {"all": ids is None, "ids": list(ids or [])})
        return [ParkedRow(*r) for r in cur.fetchall()]


def requeue_parked(using: str, ids: Sequence[uuid.UUID] | None) -> list[uuid.UUID]:
    """Make parked rows deliverable again with fresh attempts: `ids`, or all when None."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["requeue_parked"], {"all": ids is None, "ids": list(ids or [])})
        return [r[0] for r in cur.fetchall()]


def backlog(using: str) -> Backlog:
    """The outbox backlog now (one aggregate row), the stream's part after the position read
    first (rows a relay publishes between the two statements are counted as waiting once
    more: a gauge's moment)."""
    after_txid, after_seq = read_position(using)
    with server_cursor(using) as cur:
        cur.execute(QUERIES["outbox_backlog"], {"after_txid": after_txid, "after_seq": after_seq})
        unpublished, parked, oldest_created_at, oldest_age_s = one(cur)
    return Backlog(int(unpublished), int(parked), oldest_created_at,
                   None if oldest_age_s is None else float(oldest_age_s))


def postpone(using: str, failures: Sequence[Failure]) -> int:
    """Delay slow-lane rows their partition could not take now, no attempt counted; how many."""
    if not failures:
        return 0
    with server_cursor(using) as cur:
        cur.execute(QUERIES["postpone"], {"ids": [f.id for f in failures],
                                          "errors": [f.error[:2000] for f in failures],
                                          "retry_in": [f.retry_in for f in failures]})
        return cur.rowcount


def make_due(using: str, keys: Sequence[str]) -> int:
    """The waiting slow-lane rows of `keys` due now (their partition is back); how many."""
    if not keys:
        return 0
    with server_cursor(using) as cur:
        cur.execute(QUERIES["make_due"], {"keys": list(keys)})
        return cur.rowcount
