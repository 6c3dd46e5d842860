"""The only module of the relay that talks to the database: each function runs one named query
of `sql/queries.sql` in its own short transaction (autocommit), so that no transaction is ever
open across a Kafka call."""

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from core.db import one, raw_connection, server_cursor
from core.queries import QueryFile

QUERIES_FILE = Path(__file__).parent / "sql" / "queries.sql"
QUERIES = QueryFile(QUERIES_FILE)



@dataclass(frozen=True, slots=True)
class ClaimedMessage:
    """A deliverable outbox row, as the producer needs it (the payload stays opaque text)."""

    id: uuid.UUID
    topic: str
    key: str
    payload: str
    headers: dict[str, Any]
    aggregate_type: str
    aggregate_id: str
    created_at: datetime
    attempts: int
    # The row's age when read, on the database's clock, and when that was on this process's
    # monotonic clock: its age at any later moment without the relay's wall clock.
    age_at_read_s: float
    read_at: float


@dataclass(frozen=True, slots=True)
class Failure:
    """A message-level delivery failure to record: the error, and when to try again."""

    id: uuid.UUID
    error: str
    retry_in: timedelta


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

# Before every row: a read position's start.
START = (datetime(1, 1, 1, tzinfo=UTC), uuid.UUID(int=0))


def try_to_lead(using: str) -> bool:
    """Take the relays' lock for this database session, without waiting; True if taken."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["try_to_lead"], {"lock": RELAY_LOCK})
        return bool(one(cur)[0])


def resign(using: str) -> None:
    """Release the relays' lock held by this database session."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["resign"], {"lock": RELAY_LOCK})


def read_batch(using: str, *, batch_size: int,
               after: tuple[datetime, uuid.UUID] = START) -> list[ClaimedMessage]:
    """Up to `batch_size` deliverable rows after `after` in (created_at, id) order, per key only
    its oldest; nothing is written (only the leading relay reads)."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["read_batch"], {"batch_size": batch_size,
                                            "after_created_at": after[0], "after_id": after[1]})
        rows = cur.fetchall()
    read_at = time.monotonic()
    return [
        ClaimedMessage(
            id=r[0], topic=r[1], key=r[2], payload=r[3], headers=json.loads(r[4]),
            aggregate_type=r[5], aggregate_id=r[6], created_at=r[7], attempts=r[8],
            age_at_read_s=r[9], read_at=read_at,
        )
        for r in rows
    ]


def mark_published(using: str, ids: Sequence[uuid.UUID]) -> int:
    """Record delivered rows; the number marked (a row another relay already marked is skipped)."""
    if not ids:
        return 0
    with server_cursor(using) as cur:
        cur.execute(QUERIES["mark_published"], {"ids": list(ids)})
        return cur.rowcount


def record_failures(using: str, failures: Sequence[Failure], max_attempts: int) -> list[uuid.UUID]:
    """Count a failed attempt per row and delay its retry; the ids that got parked."""
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


def prune_published(using: str, retention: timedelta, chunk: int) -> int:
    """Delete up to `chunk` rows published longer than `retention` ago; the number deleted."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["prune_published"], {"retention": retention, "chunk": chunk})
        return cur.rowcount


def list_parked(using: str, limit: int) -> list[ParkedMessage]:
    with server_cursor(using) as cur:
        cur.execute(QUERIES["list_parked"], {"limit": limit})
        return [ParkedMessage(*r) for r in cur.fetchall()]


def requeue_parked(using: str, ids: Sequence[uuid.UUID] | None) -> list[uuid.UUID]:
    """Make parked rows deliverable again with fresh attempts: `ids`, or all when None."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["requeue_parked"], {"all": ids is None, "ids": list(ids or [])})
        return [r[0] for r in cur.fetchall()]


def backlog(using: str) -> Backlog:
    """The outbox backlog now (one aggregate row)."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["outbox_backlog"])
        unpublished, parked, oldest_created_at, oldest_age_s = one(cur)
    return Backlog(int(unpublished), int(parked), oldest_created_at,
                   None if oldest_age_s is None else float(oldest_age_s))
