"""Read the ledger and the outbox back, as plain Python, for assertions."""

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db import connection

AS_OF = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
TODAY = AS_OF.date()


def day(offset: int) -> datetime:
    """An as-of `offset` days after AS_OF, same time of day."""
    return AS_OF + timedelta(days=offset)


def expiring_in(days: int, *, at: time = time(12, 0), base: date = TODAY) -> datetime:
    """An expires_at whose UTC date is `days` after `base`."""
    return datetime.combine(base + timedelta(days=days), at, tzinfo=UTC)


def real_today() -> date:
    """Today's UTC date on the clock the worker runs on (tests marked `real_clock` only)."""
    return datetime.now(UTC).date()


def database_now() -> datetime:
    """The database's clock: what `now()` in the worker's SQL compares with."""
    [(now,)] = _rows("select clock_timestamp()")
    assert isinstance(now, datetime)
    return now


def run_as_ofs() -> list[datetime]:
    """The as-of of every recorded run, oldest first."""
    return [r[0] for r in _rows("select as_of from document_expiry_reminder_runs"
                                " order by started_at, as_of")]


@dataclass(frozen=True)
class Marker:
    document_id: uuid.UUID
    threshold_days: int
    notified: bool


def _rows(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def markers(document_id: uuid.UUID | None = None) -> set[Marker]:
    sql = "select document_id, threshold_days, notified from document_expiry_reminders"
    rows = _rows(sql + " where document_id = %s", (document_id,)) if document_id else _rows(sql)
    return {Marker(*r) for r in rows}


def forget_written() -> None:
    """Every marker, event and run the cycles wrote gone (the documents stay): the same day
    again, from a fresh ledger and outbox."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute("truncate document_expiry_reminders, outbox_messages,"
                       " document_expiry_reminder_runs")


def events() -> list[dict[str, Any]]:
    """Outbox payloads, oldest first."""
    return [
        json.loads(r[0]) if isinstance(r[0], str) else r[0]
        for r in _rows("select payload from outbox_messages order by created_at, id")
    ]


def events_for(owner: uuid.UUID) -> list[dict[str, Any]]:
    return [e for e in events() if e["ownerUserId"] == str(owner)]


def notified_pairs() -> list[tuple[str, int]]:
    """(documentId, thresholdDays) of every event item, with repeats."""
    return [(d["documentId"], d["thresholdDays"]) for e in events() for d in e["documents"]]


def documents_checksum() -> str:
    """A digest of person_documents, every column included."""
    rows = _rows("select md5(coalesce(string_agg(d::text, '|' order by id), '')) "
                 "from person_documents d")
    return str(rows[0][0])


def run_statuses() -> list[str]:
    return [r[0] for r in _rows("select status from document_expiry_reminder_runs "
                                "order by started_at")]


@contextmanager
def outbox_refusing(owner: uuid.UUID) -> Iterator[None]:
    """While inside, PostgreSQL itself refuses the outbox row of `owner` (a real failure inside
    the claim's statement, for one owner only); the trigger is gone afterwards."""
    with connection.cursor() as cursor:
        cursor.execute(f"""
            create function fail_one_owner() returns trigger language plpgsql as $$
            begin
                if new.aggregate_id = '{owner}' then
                    raise exception 'outbox refused this owner';
                end if;
                return new;
            end $$;
            create trigger fail_one_owner before insert on outbox_messages
                for each row execute function fail_one_owner();""")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("drop trigger fail_one_owner on outbox_messages;"
                           " drop function fail_one_owner()")

