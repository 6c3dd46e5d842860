"""The only module of the cycle that talks to the database: each function runs one named
query of `sql/queries.sql` on a Django connection's psycopg connection.

Batches travel as arrays (`= any(%s::uuid[])`, `unnest`), never as long VALUES lists.
"""

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import psycopg
from django.db import connections

from reminders import events
from reminders.queries import load
from reminders.rules import Window

QUERIES_FILE = Path(__file__).parent / "sql" / "queries.sql"


def query(name: str) -> str:
    """The SQL of a named query."""
    return load(QUERIES_FILE)[name]


def raw_connection(using: str) -> psycopg.Connection[Any]:
    """The live psycopg connection behind a Django alias (connecting if needed)."""
    wrapper = connections[using]
    wrapper.ensure_connection()
    conn = wrapper.connection
    if conn is None:
        raise psycopg.InterfaceError(f"no connection for database alias {using!r}")
    return conn  # type: ignore[no-any-return]


def _one(cur: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The single row a statement must return."""
    row = cur.fetchone()
    if row is None:
        raise psycopg.ProgrammingError("the statement returned no row")
    return tuple(row)


def _cursor(using: str) -> psycopg.Cursor[Any]:
    # A plain psycopg cursor binds parameters on the server (Django's default is client-side).
    return psycopg.Cursor(raw_connection(using))


@dataclass(frozen=True, slots=True)
class DocumentRow:
    """A window document as the worker sees it: open columns only, and its marked thresholds."""

    id: uuid.UUID
    owner_user_id: uuid.UUID
    type: str
    number_mask: str | None
    expires_on: date
    marked: tuple[int, ...]


@dataclass(slots=True)
class ClaimPlan:
    """Markers to insert, and the event items of the thresholds to notify, as parallel arrays."""

    m_document_ids: list[uuid.UUID] = field(default_factory=list)
    m_owner_ids: list[uuid.UUID] = field(default_factory=list)
    m_types: list[str] = field(default_factory=list)
    m_expires_on: list[date] = field(default_factory=list)
    m_thresholds: list[int] = field(default_factory=list)
    m_notified: list[bool] = field(default_factory=list)
    i_document_ids: list[uuid.UUID] = field(default_factory=list)
    i_types: list[str] = field(default_factory=list)
    i_number_masks: list[str | None] = field(default_factory=list)
    i_expires_on: list[date] = field(default_factory=list)
    i_days_left: list[int] = field(default_factory=list)

    def add_marker(self, doc: DocumentRow, threshold: int, *, notified: bool) -> None:
        self.m_document_ids.append(doc.id)
        self.m_owner_ids.append(doc.owner_user_id)
        self.m_types.append(doc.type)
        self.m_expires_on.append(doc.expires_on)
        self.m_thresholds.append(threshold)
        self.m_notified.append(notified)

    def add_item(self, doc: DocumentRow, days_left: int) -> None:
        self.i_document_ids.append(doc.id)
        self.i_types.append(events.event_type_of(doc.type))
        self.i_number_masks.append(doc.number_mask)
        self.i_expires_on.append(doc.expires_on)
        self.i_days_left.append(days_left)

    def __bool__(self) -> bool:
        return bool(self.m_document_ids)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    markers_won: int
    events_written: int
    notified_document_ids: frozenset[uuid.UUID]


def _window_params(window: Window, thresholds: Sequence[int], as_of_date: date) -> dict[str, Any]:
    return {
        "window_start": window.start,
        "window_end": window.end,
        "thresholds": list(thresholds),
        "as_of_date": as_of_date,
    }


def window_census(
    using: str, window: Window, thresholds: Sequence[int], as_of_date: date
) -> tuple[int, int]:
    """(documents in the window, of which due): the backlog before the cycle."""
    with _cursor(using) as cur:
        cur.execute(query("window_census"), _window_params(window, thresholds, as_of_date))
        row = _one(cur)
    return int(row[0]), int(row[1])


@contextmanager
def due_owners(
    using: str, window: Window, thresholds: Sequence[int], as_of_date: date
) -> Iterator[psycopg.ServerCursor[Any]]:
    """A held server-side cursor over the due owners, most urgent first.

    It is materialised once, on the server, when opened, and then read in batches across the
    cycle's transactions: nothing is read twice, the loop ends, and the client's memory does
    not grow with the backlog.
    """
    conn = raw_connection(using)
    cursor = conn.cursor(name=f"due_owners_{uuid.uuid4().hex}", withhold=True)
    try:
        cursor.execute(query("due_owners"), _window_params(window, thresholds, as_of_date))
        yield cursor
    finally:
        if not conn.closed:
            # If the connection broke, the server dropped the cursor with the session.
            with suppress(psycopg.Error):
                cursor.close()


def batch_documents(
    using: str, owner_ids: Sequence[uuid.UUID], window: Window
) -> list[DocumentRow]:
    """The window documents of `owner_ids` (all of them, due or not), with their markers."""
    with _cursor(using) as cur:
        cur.execute(
            query("batch_documents"),
            {"owner_ids": list(owner_ids), "window_start": window.start, "window_end": window.end},
        )
        return [
            DocumentRow(
                id=r[0], owner_user_id=r[1], type=r[2], number_mask=r[3], expires_on=r[4],
                marked=tuple(r[5]),
            )
            for r in cur
        ]


def claim_and_write(
    using: str,
    plan: ClaimPlan,
    *,
    run_id: uuid.UUID,
    as_of: datetime,
    extra_headers: dict[str, str] | None = None,
) -> ClaimResult:
    """Insert the plan's markers (insert-wins) and one outbox row per owner whose t* was won."""
    params: dict[str, Any] = {
        "m_document_ids": plan.m_document_ids,
        "m_owner_ids": plan.m_owner_ids,
        "m_types": plan.m_types,
        "m_expires_on": plan.m_expires_on,
        "m_thresholds": plan.m_thresholds,
        "m_notified": plan.m_notified,
        "i_document_ids": plan.i_document_ids,
        "i_types": plan.i_types,
        "i_number_masks": plan.i_number_masks,
        "i_expires_on": plan.i_expires_on,
        "i_days_left": plan.i_days_left,
        "run_id": run_id,
        "reminded_at": events.format_instant(as_of),
        "aggregate_type": events.AGGREGATE_TYPE,
        "event_type": events.EVENT_TYPE,
        "contract_version": events.CONTRACT_VERSION,
        "topic": events.TOPIC,
        "extra_headers": json.dumps(extra_headers) if extra_headers else None,
    }
    with _cursor(using) as cur:
        cur.execute(query("claim_and_write"), params)
        row = _one(cur)
    return ClaimResult(
        markers_won=int(row[0]), events_written=int(row[1]), notified_document_ids=frozenset(row[2])
    )


def prune_expired_markers(using: str, cutoff: date, chunk: int) -> int:
    """Delete up to `chunk` markers whose expiry date is before `cutoff`; the number deleted."""
    with _cursor(using) as cur:
        cur.execute(query("prune_expired_markers"), {"cutoff": cutoff, "chunk": chunk})
        return cur.rowcount


def count_expired_markers(using: str, cutoff: date) -> int:
    with _cursor(using) as cur:
        cur.execute(query("count_expired_markers"), {"cutoff": cutoff})
        row = _one(cur)
    return int(row[0])


def start_run(
    using: str, run_id: uuid.UUID, as_of: datetime, thresholds: Sequence[int], host: str
) -> None:
    with _cursor(using) as cur:
        cur.execute(
            query("start_run"),
            {
                "run_id": run_id,
                "as_of": as_of,
                "thresholds": ",".join(map(str, thresholds)),
                "host": host[:255],
            },
        )


def finish_run(using: str, run_id: uuid.UUID, *, status: str, counters: dict[str, int],
               duration_ms: int, error: str | None) -> None:
    with _cursor(using) as cur:
        cur.execute(
            query("finish_run"),
            {"run_id": run_id, "status": status, "duration_ms": duration_ms, "error": error,
             **counters},
        )


def last_successful_run_start(using: str) -> datetime | None:
    """Start of the latest cycle that did its work (succeeded, partial or timed out)."""
    with _cursor(using) as cur:
        cur.execute(query("last_successful_run_start"))
        row = cur.fetchone()
    return None if row is None else row[0]


def prune_run_history(using: str, cutoff: datetime, chunk: int) -> int:
    """Delete up to `chunk` runs that started before `cutoff`; the number deleted."""
    with _cursor(using) as cur:
        cur.execute(query("prune_run_history"), {"cutoff": cutoff, "chunk": chunk})
        return cur.rowcount


def last_successful_run_finish(using: str) -> datetime | None:
    """End of the latest cycle that did its work (succeeded, partial or timed out)."""
    with _cursor(using) as cur:
        cur.execute(query("last_successful_run_finish"))
        row = cur.fetchone()
    return None if row is None else row[0]


@dataclass(frozen=True, slots=True)
class RunRow:
    run_id: uuid.UUID
    status: str
    started_at: datetime
    finished_at: datetime | None


def latest_run(using: str) -> RunRow | None:
    """The most recent cycle of any instance, whatever its status."""
    with _cursor(using) as cur:
        cur.execute(query("latest_run"))
        row = cur.fetchone()
    return None if row is None else RunRow(*row)


def count_run_history(using: str, cutoff: datetime) -> int:
    with _cursor(using) as cur:
        cur.execute(query("count_run_history"), {"cutoff": cutoff})
        row = _one(cur)
    return int(row[0])
