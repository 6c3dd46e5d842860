"""The worker's promises (issue 7, invariants (a)-(e)), checked from the database alone.

    (a) no two markers for one (document, threshold);
    (b) every notified marker is in exactly one outbox event, and every document of an event
        has its notified marker, written by the same run (all-or-nothing per owner), unless a
        later run pruned it (its expiry date left the retention window);
    (c) no empty event, no document twice in one event, and no owner with two events for
        the same as-of day;
    (d) after a final clean run, markers and events are exactly what the reference model
        (tests/reference.py) says;
    (e) person_documents is byte-for-byte unchanged (md5 over every column of every row).

`check_invariants` raises AssertionError naming the first broken promise, with examples.
"""

import json
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from django.db import connection, transaction

from tests.reference import RefDocument, ReferenceLedger


@dataclass(frozen=True)
class Event:
    id: uuid.UUID
    owner: uuid.UUID
    run_id: uuid.UUID
    reminded_on: date
    documents: list[dict[str, Any]]


@dataclass(frozen=True)
class Snapshot:
    """What the worker has written: markers (document, threshold) -> (notified, owner, run), and
    the outbox events."""

    markers: dict[tuple[uuid.UUID, int], tuple[bool, uuid.UUID, uuid.UUID]]
    duplicate_markers: list[tuple[Any, ...]]
    events: list[Event]
    pruned_before: date | None  # markers expiring before this day may have been pruned

    def marker_set(self) -> set[tuple[uuid.UUID, int, bool]]:
        return {(d, t, v[0]) for (d, t), v in self.markers.items()}

    def events_by_owner_day(self) -> dict[tuple[uuid.UUID, date], dict[uuid.UUID, dict[str, Any]]]:
        out: dict[tuple[uuid.UUID, date], dict[uuid.UUID, dict[str, Any]]] = {}
        for event in self.events:
            items = out.setdefault((event.owner, event.reminded_on), {})
            for item in event.documents:
                items[uuid.UUID(item["documentId"])] = item
        return out


def _rows(sql: str) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        if not connection.in_atomic_block:
            cursor.execute("reset role")
        cursor.execute(sql)
        return list(cursor.fetchall())


def documents_md5() -> str:
    """(e): a digest of person_documents, every column of every row (bytea included)."""
    [(digest,)] = _rows("select md5(coalesce(string_agg(d::text, '|' order by id), ''))"
                        " from person_documents d")
    return str(digest)


def snapshot(retention_days: int = 90) -> Snapshot:
    """Markers, events and runs as of one instant (a killed worker's last commit may land
    between two statements)."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("set transaction isolation level repeatable read")
        return _snapshot(retention_days)


def _snapshot(retention_days: int) -> Snapshot:
    markers = {
        (d, t): (n, o, r) for d, t, n, o, r in _rows(
            "select document_id, threshold_days, notified, owner_user_id, run_id"
            " from document_expiry_reminders")
    }
    duplicates = _rows("select document_id, threshold_days, count(*)"
                       " from document_expiry_reminders group by 1, 2 having count(*) > 1")
    events = []
    for msg_id, aggregate_id, headers, payload in _rows(
            "select id, aggregate_id, headers, payload from outbox_messages order by created_at, id"):
        body = json.loads(payload) if isinstance(payload, str) else payload
        head = json.loads(headers) if isinstance(headers, str) else headers
        events.append(Event(
            id=msg_id, owner=uuid.UUID(aggregate_id), run_id=uuid.UUID(head["correlation_id"]),
            reminded_on=date.fromisoformat(body["remindedAt"][:10]),
            documents=list(body["documents"]),
        ))
    [(last_pruning_as_of,)] = _rows(
        "select max(as_of) from document_expiry_reminder_runs"
        " where status in ('succeeded', 'partial')")
    pruned_before = (None if last_pruning_as_of is None
                     else last_pruning_as_of.date() - timedelta(days=retention_days))
    return Snapshot(markers, duplicates, events, pruned_before)


def _fail(promise: str, examples: list[Any]) -> None:
    if examples:
        raise AssertionError(f"invariant {promise} broken ({len(examples)}): {examples[:5]}")


def check_structure(snap: Snapshot | None = None) -> Snapshot:
    """(a), (b) and (c): hold at every moment, even right after a crash."""
    snap = snap or snapshot()
    _fail("(a) one marker per (document, threshold)", snap.duplicate_markers)

    listed = Counter((uuid.UUID(i["documentId"]), int(i["thresholdDays"]))
                     for e in snap.events for i in e.documents)
    notified = {k for k, v in snap.markers.items() if v[0]}
    _fail("(b) notified marker in exactly one event",
          [(k, listed[k]) for k in notified if listed[k] != 1])
    expiry = {(uuid.UUID(i["documentId"]), int(i["thresholdDays"])): date.fromisoformat(i["expiresAt"])
              for e in snap.events for i in e.documents}
    _fail("(b) event item without its notified marker",
          sorted(k for k in set(listed) - notified
                 if snap.pruned_before is None or expiry[k] >= snap.pruned_before))
    same_run = []
    for event in snap.events:
        for item in event.documents:
            key = (uuid.UUID(item["documentId"]), int(item["thresholdDays"]))
            marker = snap.markers.get(key)
            if marker and (marker[1], marker[2]) != (event.owner, event.run_id):
                same_run.append((event.id, key, marker))
    _fail("(b) event and its markers written together (same owner, same run)", same_run)

    _fail("(c) no empty event", [e.id for e in snap.events if not e.documents])
    _fail("(c) a document once per event",
          [e.id for e in snap.events
           if len({i["documentId"] for i in e.documents}) != len(e.documents)])
    per_day = Counter((e.owner, e.reminded_on) for e in snap.events)
    _fail("(c) one event per owner per as-of day", [k for k, n in per_day.items() if n > 1])
    return snap


def check_matches_model(model: ReferenceLedger, snap: Snapshot | None = None) -> None:
    """(d): the ledger and the events are exactly the model's."""
    snap = snap or snapshot()
    got, want = snap.marker_set(), model.marker_set()
    _fail("(d) marker missing (lost reminder)", sorted(want - got, key=str))
    _fail("(d) unexpected marker", sorted(got - want, key=str))
    got_events, want_events = snap.events_by_owner_day(), model.events
    _fail("(d) event missing", sorted(set(want_events) - set(got_events), key=str))
    _fail("(d) unexpected event", sorted(set(got_events) - set(want_events), key=str))
    _fail("(d) event content differs from the model",
          [(k, got_events[k], want_events[k]) for k in want_events
           if k in got_events and got_events[k] != want_events[k]])


def check_owner_atomicity(before: ReferenceLedger, after: ReferenceLedger,
                          documents: list[RefDocument],
                          snap: Snapshot | None = None) -> dict[str, int]:
    """No half-written owner: after an interrupted day, each owner's markers and events are
    either all as before the day or all as after it. Returns how many owners are in each."""
    snap = snap or snapshot()
    owner_of = {doc.id: doc.owner for doc in documents}

    def by_owner(markers: set[tuple[uuid.UUID, int, bool]],
                 events: dict[tuple[uuid.UUID, date], dict[uuid.UUID, dict[str, Any]]]
                 ) -> dict[uuid.UUID, tuple[frozenset[Any], frozenset[Any]]]:
        m: dict[uuid.UUID, set[Any]] = defaultdict(set)
        e: dict[uuid.UUID, set[Any]] = defaultdict(set)
        for marker in markers:
            m[owner_of.get(marker[0], marker[0])].add(marker)
        for (owner, day), items in events.items():
            e[owner].add((day, json.dumps(sorted(items.values(), key=lambda i: i["documentId"]),
                                          sort_keys=True)))
        return {o: (frozenset(m[o]), frozenset(e[o])) for o in set(m) | set(e)}

    got = by_owner(snap.marker_set(), snap.events_by_owner_day())
    old = by_owner(before.marker_set(), before.events)
    new = by_owner(after.marker_set(), after.events)
    empty: tuple[frozenset[Any], frozenset[Any]] = (frozenset(), frozenset())
    counts = Counter[str](done=0, untouched=0)
    half = []
    for owner in set(got) | set(old) | set(new):
        state = got.get(owner, empty)
        if state == new.get(owner, empty):
            counts["done"] += 1
        elif state == old.get(owner, empty):
            counts["untouched"] += 1
        else:
            half.append(owner)
    counts["half_written"] = len(half)
    _fail("(b) no half-written owner", half)
    return dict(counts)


def tally(snap: Snapshot, model: ReferenceLedger | None = None) -> dict[str, int]:
    """The chaos report's figures, counted in what the worker wrote (and, given the model of
    the clean runs, against it): `duplicated` rows written twice (markers of one (document,
    threshold), event items of one (document, threshold), events of one owner and day);
    `lost` markers and event items the model has that the database lacks; `unexpected` the
    reverse. A changed field counts as lost and unexpected."""
    listed = Counter((i["documentId"], int(i["thresholdDays"])) for e in snap.events
                     for i in e.documents)
    per_day = Counter((e.owner, e.reminded_on) for e in snap.events)
    figures = {"duplicated": sum(int(n) - 1 for *_, n in snap.duplicate_markers)
               + sum(n - 1 for n in listed.values()) + sum(n - 1 for n in per_day.values())}
    if model is not None:
        got, want = snap.marker_set(), model.marker_set()
        got_items = {(owner, day, json.dumps(item, sort_keys=True))
                     for (owner, day), items in snap.events_by_owner_day().items()
                     for item in items.values()}
        want_items = {(owner, day, json.dumps(item, sort_keys=True))
                      for (owner, day), items in model.events.items() for item in items.values()}
        figures["lost"] = len(want - got) + len(want_items - got_items)
        figures["unexpected"] = len(got - want) + len(got_items - want_items)
    return figures


def check_invariants(*, documents_before: str, model: ReferenceLedger | None = None,
                     retention_days: int = 90, snap: Snapshot | None = None) -> Snapshot:
    """All of (a)-(e); (d) only when a model of the clean runs is given. `retention_days`: the
    shortest retention any run used (markers older than that may have been pruned). `snap`: a
    snapshot already taken (e.g. for `tally`), checked instead of a new one."""
    snap = check_structure(snap or snapshot(retention_days))
    if model is not None:
        check_matches_model(model, snap)
    assert documents_md5() == documents_before, "invariant (e) broken: person_documents changed"
    return snap
