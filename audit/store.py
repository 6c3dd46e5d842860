"""The audit's only reads of the database: each named statement of sql/queries.sql, its row
read by column name into the type below. Each check's statement returns one row: what it
examined, as counts, and each of its findings as a JSON array named by its code."""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import class_row

from audit.against_topic import TopicEvent
from core.db import raw_connection
from core.queries import QueryFile
from reminders import events
from reminders.models import SUCCESSFUL_STATUSES

QUERIES = QueryFile(Path(__file__).parent / "sql" / "queries.sql")
UUID_PATTERN = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
Ids = list[dict[str, Any]]
Row = TypeVar("Row")


@dataclass(frozen=True, slots=True)
class Clock:
    now: datetime


@dataclass(frozen=True, slots=True)
class PruningRun:
    as_of: datetime | None


@dataclass(frozen=True, slots=True)
class LedgerOutbox:
    runs: int
    events: int
    event_items: int
    notified_markers: int
    marker_without_event: Ids
    event_without_marker: Ids
    notified_twice: Ids
    already_queued: Ids


@dataclass(frozen=True, slots=True)
class LoopCycle:
    run_id: UUID
    as_of: datetime
    started_at: datetime
    thresholds: str


@dataclass(frozen=True, slots=True)
class LeftBehind:
    changed_since: int
    left_behind: Ids


@dataclass(frozen=True, slots=True)
class RelayWaits:
    events: int
    waited_too_long: Ids


@dataclass(frozen=True, slots=True)
class Parked:
    parked: Ids
    parked_off_allowlist: Ids


@dataclass(frozen=True, slots=True)
class EventId:
    id: str


def _all(using: str, name: str, row: type[Row], params: Mapping[str, Any]) -> list[Row]:
    with psycopg.Cursor(raw_connection(using), row_factory=class_row(row)) as cur:
        cur.execute(QUERIES[name], params)
        return cur.fetchall()


def _one(using: str, name: str, row: type[Row], params: Mapping[str, Any]) -> Row:
    [found] = _all(using, name, row, params)
    return found


def begin_snapshot(using: str) -> datetime:
    """Inside the caller's transaction: one read-only snapshot for every check; its clock."""
    with psycopg.Cursor(raw_connection(using)) as cur:
        cur.execute(QUERIES["audit_snapshot"])
        cur.execute(QUERIES["audit_session"])
    return _one(using, "snapshot_clock", Clock, {}).now


def latest_pruning_as_of(using: str) -> datetime | None:
    """The as-of of the newest cycle that pruned: markers before its cutoff may be gone."""
    return _one(using, "latest_pruning_run", PruningRun,
                {"pruning_statuses": sorted(SUCCESSFUL_STATUSES)}).as_of


def ledger_outbox(using: str, *, since: datetime, until: datetime,
                  pruned_before: str) -> LedgerOutbox:
    return _one(using, "ledger_outbox", LedgerOutbox, {
        "since": since, "until": until, "event_type": events.EVENT_TYPE,
        "pruned_before": pruned_before, "uuid_pattern": UUID_PATTERN,
        "message_id_namespace": events.MESSAGE_ID_NAMESPACE})


def last_loop_cycle(using: str) -> LoopCycle | None:
    cycles = _all(using, "last_loop_cycle", LoopCycle, {})
    return cycles[0] if cycles else None


def left_behind(using: str, cycle: LoopCycle, *, as_of_date: date, window_start: datetime,
                window_end: datetime, thresholds: tuple[int, ...],
                max_documents: int) -> LeftBehind:
    return _one(using, "left_behind", LeftBehind, {
        "window_start": window_start, "window_end": window_end, "thresholds": list(thresholds),
        "as_of_date": as_of_date, "started_at": cycle.started_at,
        "run_id": str(cycle.run_id), "event_type": events.EVENT_TYPE,
        "max_documents": max_documents})


def relay_waits(using: str, *, since: datetime, until: datetime, now: datetime,
                bound: timedelta) -> RelayWaits:
    return _one(using, "relay_waits", RelayWaits,
                {"since": since, "until": until, "now": now, "bound": bound})


def parked(using: str, topics: frozenset[str]) -> Parked:
    """The parked events, those whose topic is not on `topics` (the relay's allowlist) apart."""
    return _one(using, "parked", Parked, {"topics": sorted(topics)})


def window_events(using: str, *, since: datetime, until: datetime) -> list[TopicEvent]:
    return _all(using, "window_events_for_topic", TopicEvent, {"since": since, "until": until})


def events_held(using: str, ids: list[str]) -> set[str]:
    """Which of these ids (UUIDs) the outbox holds, wherever they were written."""
    return {r.id for r in _all(using, "events_by_id", EventId, {"ids": ids})} if ids else set()
