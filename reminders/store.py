"""The only module of the cycle that talks to the database: each function runs one named
query of `sql/queries.sql` on a Django connection's psycopg connection.

Batches travel as arrays (`= any(%s::uuid[])`, `unnest`), never as long VALUES lists.
"""

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from django.db import connections

from core.db import one, raw_connection, server_cursor
from core.queries import QueryFile
from reminders import events
from reminders.models import SUCCESSFUL_STATUSES
from reminders.rules import Window

QUERIES_FILE = Path(__file__).parent / "sql" / "queries.sql"
QUERIES = QueryFile(QUERIES_FILE)



@dataclass(frozen=True, slots=True)
class DocumentRow:
    """A window document as the worker sees it: open columns only, and its markers
    (threshold -> the expiry date the marker was written for)."""

    id: uuid.UUID
    owner_user_id: uuid.UUID
    type: str
    number_mask: str | None
    expires_on: date
    markers: dict[int, date]


class NotifiedItem(NamedTuple):
    """A document that went into its owner's event: what the log line says (never the mask),
    ids as text."""

    owner_user_id: str
    document_id: str
    type: str
    threshold_days: int
    days_left: int


# The log line's fields: the leading values of every `BatchClaim.notified` row.
NOTIFIED_FIELDS = NotifiedItem._fields
THRESHOLD_DAYS = NOTIFIED_FIELDS.index("threshold_days")


@dataclass(frozen=True, slots=True)
class BatchClaim:
    """What one batch's claim statement did."""

    markers_won: int
    due_documents: int
    events_written: int
    markers_rearmed: int
    # owners whose reminder (the same message id) the outbox already holds: their markers
    # were written again, their event was not (a ledger restored or rolled back without its
    # outbox); their items are not in `notified`
    owners_already_queued: int
    # By owner, then days left, then document; each row starts with NOTIFIED_FIELDS (the
    # claim statement's rows as they come: nothing is built per reminder).
    notified: Sequence[Sequence[Any]]


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
    """(documents in the window, of which due): the backlog, outside a cycle."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["window_census"], _window_params(window, thresholds, as_of_date))
        row = one(cur)
    return int(row[0]), int(row[1])


class DueOwner(NamedTuple):
    """An owner with due documents, as the due-owners pass lists them."""

    owner_user_id: uuid.UUID
    first_due_expiry: datetime
    due_documents: int
    # its due documents' ids as text, most urgent first (UTC expiry date, id): the claim
    # reads them by primary key
    document_ids: list[str]


class DueOwners:
    """The due owners of a cycle, most urgent first, and the window's census, from one held
    server-side cursor.

    The cursor is materialised once, on the server, when opened, and then read in batches
    across the cycle's transactions: nothing is read twice, the loop ends, and the client's
    memory does not grow with the backlog. Its rows list every owner of the window, due ones
    first; reading stops at the first owner with nothing due.
    """

    def __init__(self, cursor: psycopg.ServerCursor[Any]) -> None:
        self._cursor = cursor
        self._pending: list[tuple[Any, ...]] = [tuple(r) for r in cursor.fetchmany(1)]
        first = self._pending[0] if self._pending else None
        self.window_documents = int(first[3]) if first else 0
        self.due_documents = int(first[4]) if first else 0
        self._done = not self.due_documents

    def fetch(self, size: int) -> list[DueOwner]:
        """Up to `size` more due owners; empty at the end."""
        if self._done:
            return []
        chunk = self._pending or [tuple(r) for r in self._cursor.fetchmany(size)]
        self._pending = []
        rows: list[DueOwner] = []
        for row in chunk:
            if not row[2]:
                break
            rows.append(DueOwner(row[0], row[1], row[2], row[5]))
        self._done = len(rows) < len(chunk) or not chunk
        return rows


class DuePages:
    """The due owners of a cycle as DueOwners lists them, for a connection that holds nothing
    across transactions (a transaction pooler, `DISABLE_SERVER_SIDE_CURSORS`): a page of
    `page_owners` at a time, each page the one pass again in a transaction of its own, after the
    last owner read (keyset on first due expiry, owner), leaving out owners this cycle claimed.
    Nothing is read twice, the loop ends (the key only grows), and memory holds one page."""

    def __init__(self, read_page: Callable[[DueOwner | None], list[tuple[Any, ...]]],
                 page_owners: int) -> None:
        self._read_page = read_page
        self._page_owners = page_owners
        page = read_page(None)
        self._pending = _page_owners(page)
        self._more = len(self._pending) == page_owners  # a full page: more may follow
        first = page[0] if page else None
        # the census of the first pass, before any claim (later passes see this cycle's markers)
        self.window_documents = int(first[3]) if first else 0
        self.due_documents = int(first[4]) if first else 0
        self._last: DueOwner | None = None

    def fetch(self, size: int) -> list[DueOwner]:
        """Up to `size` more due owners; empty at the end."""
        if not self._pending and self._more:
            self._pending = _page_owners(self._read_page(self._last))
            self._more = len(self._pending) == self._page_owners
        chunk, self._pending = self._pending[:size], self._pending[size:]
        rows = [DueOwner(r[0], r[1], int(r[2]), r[5].split(",")) for r in chunk]
        if rows:
            self._last = rows[-1]
        return rows


def _page_owners(page: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A page's owners (its row of nulls, when none is left, only carries the census)."""
    return [row for row in page if row[0] is not None]


# A page of DuePages holds as many owners as this many batches hold documents: each page is
# one pass over the window (about the warm cycle's time), so pages are large (100,000 owners at
# the default batch size, a few megabytes of ids).
DUE_PAGE_BATCHES = 200


def holds_sessions(using: str) -> bool:
    """Does the alias keep its server session across transactions (no transaction pooler)?"""
    return not connections[using].settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")


def tune_claim_session(using: str) -> None:
    """This thread's session of the alias tuned for the claims (the cycle's, in `due_owners`,
    and a second claim connection's, `reminders.claim_connections`), where the alias keeps its session:
    behind a transaction pooler a session setting would reach the server connection's next
    client (`tune_transaction` tunes each page's transaction there)."""
    if holds_sessions(using):
        raw_connection(using).execute(QUERIES["tune_session"])


@contextmanager
def due_owners(
    using: str, window: Window, thresholds: Sequence[int], as_of_date: date,
    *, run_id: uuid.UUID, page_owners: int,
) -> Iterator[DueOwners | DuePages]:
    """The due owners and the census of the window: from one held cursor (DueOwners), or by
    pages (DuePages) where the alias disables server-side cursors (a transaction pooler)."""
    if not holds_sessions(using):
        yield DuePages(_due_page_reader(using, window, thresholds, as_of_date, run_id=run_id,
                                        page_owners=page_owners), page_owners)
        return
    tune_claim_session(using)
    conn = raw_connection(using)
    cursor = conn.cursor(name=f"due_owners_{uuid.uuid4().hex}", withhold=True)
    try:
        # Declared in a transaction of its own, which runs the pass when it commits; the plan
        # setting lasts until then (never into the claims on this connection).
        with conn.transaction():
            conn.execute(QUERIES["due_owners_plan"])
            # Binary rows: the owner, the expiry and the ids come as values, no text parsed
            # (a 1M backlog's 260,000 due owners: 0.45 to 0.5 s to read, 0.7 s as text).
            cursor.execute(QUERIES["due_owners"], _window_params(window, thresholds, as_of_date),
                           binary=True)
        yield DueOwners(cursor)
    finally:
        # If the connection broke, the server dropped the cursor with the session: close()
        # then only marks it closed (psycopg talks to the server only on an open connection).
        with suppress(psycopg.Error):
            cursor.close()


def _due_page_reader(
    using: str, window: Window, thresholds: Sequence[int], as_of_date: date,
    *, run_id: uuid.UUID, page_owners: int,
) -> Callable[[DueOwner | None], list[tuple[Any, ...]]]:
    params = {**_window_params(window, thresholds, as_of_date), "run_id": run_id,
              "page_owners": page_owners}

    def read_page(after: DueOwner | None) -> list[tuple[Any, ...]]:
        conn = raw_connection(using)
        # Settings for this transaction only: nothing outlives it on a pooled server connection.
        with conn.transaction(), psycopg.Cursor(conn) as cur:
            cur.execute(QUERIES["tune_transaction"])
            cur.execute(QUERIES["due_owners_plan"])
            cur.execute(QUERIES["due_owners_page"], {
                **params,
                "after_expiry": after.first_due_expiry if after else None,
                "after_owner": after.owner_user_id if after else None,
            })
            return cur.fetchall()

    return read_page


def batch_documents(
    using: str, owner_ids: Sequence[uuid.UUID], window: Window
) -> list[DocumentRow]:
    """The window documents of `owner_ids` (all of them, due or not), with their markers
    of any expiry date (rules.decide tells current from stale)."""
    with server_cursor(using) as cur:
        cur.execute(
            QUERIES["batch_documents"],
            {"owner_ids": list(owner_ids), "window_start": window.start, "window_end": window.end},
        )
        return [
            DocumentRow(
                id=r[0], owner_user_id=r[1], type=r[2], number_mask=r[3], expires_on=r[4],
                markers=dict(zip(r[5], r[6], strict=True)),
            )
            for r in cur
        ]


def claim_batch(
    using: str,
    document_ids: Sequence[str],
    window: Window,
    thresholds: Sequence[int],
    as_of_date: date,
    *,
    run_id: uuid.UUID,
    as_of: datetime,
    extra_headers: dict[str, str] | None = None,
) -> BatchClaim:
    """For a batch of owners, given by their due documents (whole owners: each one's
    `DueOwner.document_ids`, at most `events.MAX_DOCUMENTS_PER_EVENT` of them, the caller
    caps), in one statement: decide, insert the markers
    (insert-wins; a marker of an earlier expiry date is re-armed in place) and one outbox row
    per owner whose t* was won, named after its reminder (`events.message_id`; an owner whose
    reminder the outbox holds already is counted, not written again). No document row travels
    to the worker and back."""
    params: dict[str, Any] = {
        "document_ids": list(document_ids),
        **_window_params(window, thresholds, as_of_date),
        "run_id": run_id,
        **events.envelope_params(as_of),
        "extra_headers": json.dumps(extra_headers) if extra_headers else None,
    }
    with server_cursor(using) as cur:
        cur.execute(QUERIES["claim_batch"], params, binary=True)
        return claim_from_rows(cur.fetchall())


def claim_from_rows(rows: list[tuple[Any, ...]]) -> BatchClaim:
    """The claim statement's rows as a BatchClaim (nothing built per notified row)."""
    if not rows:
        raise psycopg.ProgrammingError("the statement returned no row")
    totals = len(NOTIFIED_FIELDS)
    markers_won, due_documents, events_written, markers_rearmed, already_queued = rows[0][totals:]
    return BatchClaim(
        markers_won=int(markers_won),
        due_documents=int(due_documents),
        events_written=int(events_written),
        markers_rearmed=int(markers_rearmed),
        owners_already_queued=int(already_queued),
        notified=rows if rows[0][0] is not None else [],  # one row of nulls: none notified
    )


def prune_expired_markers(using: str, cutoff: date, chunk: int) -> int:
    """Delete up to `chunk` markers whose expiry date is before `cutoff`; the number deleted.
    In a transaction (a chunk's own): the plan setting before it lasts until its end."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["prune_plan"])
        cur.execute(QUERIES["prune_expired_markers"], {"cutoff": cutoff, "chunk": chunk})
        return cur.rowcount


def count_expired_markers(using: str, cutoff: date) -> int:
    with server_cursor(using) as cur:
        cur.execute(QUERIES["count_expired_markers"], {"cutoff": cutoff})
        row = one(cur)
    return int(row[0])


class PruneCensus(NamedTuple):
    """What a prune down to a cutoff would delete, against the ledger (query `prune_census`)."""

    expired: int  # markers expiring before the cutoff: what the prune deletes
    unexpired: int  # of those, markers of documents expiring on or after `today`
    markers: int  # the whole ledger
    today: date  # the database's UTC date: the clock the worker's own cannot move


def prune_census(using: str, cutoff: date) -> PruneCensus:
    with server_cursor(using) as cur:
        cur.execute(QUERIES["prune_census"], {"cutoff": cutoff})
        expired, unexpired, markers, today = one(cur)
    return PruneCensus(int(expired), int(unexpired), int(markers), today)


def close_abandoned_runs(using: str, older_than: timedelta) -> int:
    """Record runs still `running` after `older_than` as failed; how many there were."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["close_abandoned_runs"], {"older_than": older_than})
        return cur.rowcount


def start_run(
    using: str, run_id: uuid.UUID, as_of: datetime, thresholds: Sequence[int], host: str,
    *, tick: datetime | None = None,
) -> None:
    """Record a cycle as running: a loop run when it is for a `tick`, else a manual one."""
    with server_cursor(using) as cur:
        cur.execute(
            QUERIES["start_run"],
            {
                "run_id": run_id,
                "as_of": as_of,
                "thresholds": ",".join(map(str, thresholds)),
                "host": host[:255],
                "trigger": "manual" if tick is None else "loop",
                "tick": tick,
            },
        )


def finish_run(using: str, run_id: uuid.UUID, *, status: str, counters: dict[str, int],
               duration_ms: int, error: str | None) -> None:
    with server_cursor(using) as cur:
        cur.execute(
            QUERIES["finish_run"],
            {"run_id": run_id, "status": status, "duration_ms": duration_ms, "error": error,
             **counters},
        )


def _successful() -> dict[str, list[str]]:
    return {"successful": sorted(str(status) for status in SUCCESSFUL_STATUSES)}


def last_loop_tick(using: str) -> datetime | None:
    """The latest tick a loop run did its work for (succeeded, partial or timed out)."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["last_loop_tick"], _successful())
        row = cur.fetchone()
    return None if row is None else row[0]


def prune_run_history(using: str, older_than: timedelta, chunk: int) -> int:
    """Delete up to `chunk` runs that started over `older_than` ago on the database's clock;
    the number deleted."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["prune_run_history"], {"older_than": older_than, "chunk": chunk})
        return cur.rowcount


@dataclass(frozen=True, slots=True)
class RunHistoryAges:
    """The run history's latest success and latest run, aged on the database's clock (its
    `now()` stamped `started_at` and `finished_at`): never compared with the worker's clock.
    The instants are as recorded, for messages."""

    last_success: datetime | None
    since_success: timedelta | None
    latest_status: str | None
    latest_started_at: datetime | None
    latest_age: timedelta | None


def run_history_ages(using: str) -> RunHistoryAges:
    """How long ago the latest cycle that did its work (succeeded, partial or timed out) ended,
    and the latest cycle of any instance, whatever its status, started."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["run_history_ages"], _successful())
        row = one(cur)
    return RunHistoryAges(*row)


def count_run_history(using: str, older_than: timedelta) -> tuple[int, datetime]:
    """What prune_run_history would delete: (runs, the cutoff instant on the database's clock)."""
    with server_cursor(using) as cur:
        cur.execute(QUERIES["count_run_history"], {"older_than": older_than})
        row = one(cur)
    return int(row[0]), row[1]
