"""The worker's promises, the invariants (a)-(e) the chaos tests hold (docs/testing.md),
checked from the database alone.

    (a) no two markers for one (document, threshold);
    (b) every notified marker is in exactly one outbox event of the run that wrote it, for
        the marker's expiry date, and every document of an event has its notified marker,
        written by the same run (all-or-nothing per owner), unless a later run pruned it (its
        expiry date left the retention window) or re-armed it (the document's expiry date
        changed: refinement 5);
    (c) no empty event, no document twice in one event, and no owner with two events for
        the same as-of day;
    (d) after a final clean run, markers and events are exactly what the reference model
        (tests/support/reference.py) says;
    (e) person_documents is byte-for-byte unchanged (md5 over every column of every row).

`check_invariants` raises AssertionError naming the first broken promise, with examples.
"""

import json
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db import connection, transaction

from audit.checks import AuditOptions, run_audit
from core.roles import AUDITOR_ROLE
from reminders import events
from tests.support.db_roles import as_role
from tests.support.reference import RefDocument, ReferenceLedger


@dataclass(frozen=True)
class Event:
    id: uuid.UUID
    owner: uuid.UUID
    run_id: uuid.UUID
    reminded_on: date
    documents: list[dict[str, Any]]


@dataclass(frozen=True)
class StoredMarker:
    notified: bool
    owner: uuid.UUID
    run_id: uuid.UUID
    expiry_day: date


@dataclass(frozen=True)
class Snapshot:
    """What the worker has written: markers by (document, threshold), the outbox events, and
    each run's as-of date."""

    markers: dict[tuple[uuid.UUID, int], StoredMarker]
    duplicate_markers: list[tuple[Any, ...]]
    events: list[Event]
    pruned_before: date | None  # markers expiring before this day may have been pruned
    run_days: dict[uuid.UUID, date]
    armings: dict[tuple[uuid.UUID, int], int]  # (document, threshold) -> its marker's arming

    def marker_set(self) -> set[tuple[uuid.UUID, int, bool, date]]:
        return {(d, t, m.notified, m.expiry_day) for (d, t), m in self.markers.items()}

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
    rows = _rows("select document_id, threshold_days, notified, owner_user_id, run_id,"
                 " expires_at, armings from document_expiry_reminders")
    markers = {(d, t): StoredMarker(n, o, r, e) for d, t, n, o, r, e, _ in rows}
    armings = {(d, t): a for d, t, *_, a in rows}
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
        " where status in ('succeeded', 'partial', 'timed_out')")
    pruned_before = (None if last_pruning_as_of is None
                     else last_pruning_as_of.date() - timedelta(days=retention_days))
    run_days = {r: a.date() for r, a in _rows(
        "select run_id, as_of at time zone 'UTC' from document_expiry_reminder_runs")}
    return Snapshot(markers, duplicates, events, pruned_before, run_days, armings)


def _fail(promise: str, examples: list[Any]) -> None:
    if examples:
        raise AssertionError(f"invariant {promise} broken ({len(examples)}): {examples[:5]}")


def check_structure(snap: Snapshot | None = None) -> Snapshot:
    """(a), (b) and (c): hold at every moment, even right after a crash."""
    snap = snap or snapshot()
    _fail("(a) one marker per (document, threshold)", snap.duplicate_markers)

    # (document, threshold, expiry date, run) of every event item, and of every notified marker
    listed = Counter((uuid.UUID(i["documentId"]), int(i["thresholdDays"]),
                      date.fromisoformat(i["expiresAt"]), e.run_id)
                     for e in snap.events for i in e.documents)
    notified = {(d, t, m.expiry_day, m.run_id) for (d, t), m in snap.markers.items() if m.notified}
    _fail("(b) notified marker in exactly one event of its run, for its expiry date",
          [(k, listed[k]) for k in notified if listed[k] != 1])
    unmatched = []
    for event in snap.events:
        for item in event.documents:
            document, threshold = uuid.UUID(item["documentId"]), int(item["thresholdDays"])
            expiry = date.fromisoformat(item["expiresAt"])
            marker = snap.markers.get((document, threshold))
            if marker == StoredMarker(True, event.owner, event.run_id, expiry):
                continue
            if not _pruned_or_rearmed(snap, event, document, expiry, marker):
                unmatched.append((event.id, document, threshold, marker))
    _fail("(b) event item with its notified marker, same owner, same run", unmatched)

    _fail("(c) no empty event", [e.id for e in snap.events if not e.documents])
    _fail("(c) a document once per event",
          [e.id for e in snap.events
           if len({i["documentId"] for i in e.documents}) != len(e.documents)])
    per_day = Counter((e.owner, e.reminded_on) for e in snap.events)
    _fail("(c) one event per owner per as-of day", [k for k, n in per_day.items() if n > 1])
    return snap


def _pruned_or_rearmed(snap: Snapshot, event: Event, document: uuid.UUID, expiry: date,
                       marker: StoredMarker | None) -> bool:
    """An event item whose marker is gone or changed since, legitimately: pruned (its date
    left the retention window), or re-armed by a later day's run for a new expiry date (and
    perhaps pruned after that, which a later item for another date of the document shows)."""
    if snap.pruned_before is not None and expiry < snap.pruned_before:
        return True
    if marker is None:
        return any(e.reminded_on > event.reminded_on and date.fromisoformat(i["expiresAt"]) != expiry
                   for e in snap.events for i in e.documents
                   if uuid.UUID(i["documentId"]) == document)
    marker_day = snap.run_days.get(marker.run_id)
    return marker.expiry_day != expiry or (
        marker_day is not None and marker_day > event.reminded_on)


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
    # one arming, one id: each marker in the model's arming, each event under the model's id
    _fail("(d) marker's arming differs from the model",
          sorted((k, snap.armings.get(k), a) for k, a in model.armings().items()
                 if snap.armings.get(k) != a))
    got_ids = {(e.owner, e.reminded_on): e.id for e in snap.events}
    _fail("(d) event's message id differs from the model",
          sorted((k, got_ids.get(k), i) for k, i in model.message_ids().items()
                 if got_ids.get(k) != i))


OwnerState = tuple[frozenset[Any], frozenset[Any]]


def _by_owner(owner_of: dict[uuid.UUID, uuid.UUID], markers: set[tuple[uuid.UUID, int, bool, date]],
              events: dict[tuple[uuid.UUID, date], dict[uuid.UUID, dict[str, Any]]]
              ) -> dict[uuid.UUID, OwnerState]:
    """Each owner's markers and events (day, items), comparable as a whole."""
    m: dict[uuid.UUID, set[Any]] = defaultdict(set)
    e: dict[uuid.UUID, set[Any]] = defaultdict(set)
    for marker in markers:
        m[owner_of.get(marker[0], marker[0])].add(marker)
    for (owner, day), items in events.items():
        e[owner].add((day, json.dumps(sorted(items.values(), key=lambda i: i["documentId"]),
                                      sort_keys=True)))
    return {o: (frozenset(m[o]), frozenset(e[o])) for o in set(m) | set(e)}


def check_owner_atomicity(before: ReferenceLedger, after: ReferenceLedger,
                          documents: list[RefDocument],
                          snap: Snapshot | None = None) -> dict[str, int]:
    """No half-written owner: after an interrupted day, each owner's markers and events are
    either all as before the day or all as after it. Returns how many owners are in each."""
    snap = snap or snapshot()
    owner_of = {doc.id: doc.owner for doc in documents}
    got = _by_owner(owner_of, snap.marker_set(), snap.events_by_owner_day())
    old = _by_owner(owner_of, before.marker_set(), before.events)
    new = _by_owner(owner_of, after.marker_set(), after.events)
    empty: OwnerState = (frozenset(), frozenset())
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
    threshold), event items of one (document, threshold, expiry), events of one owner and day);
    `lost` markers and event items the model has that the database lacks; `unexpected` the
    reverse. A changed field counts as lost and unexpected."""
    # a renewed document is told again at a threshold with its new expiry: not a duplicate;
    # nor is one corrected back to an expiry told before, in a new arming, which the model
    # (when given) tells again too
    listed = Counter((i["documentId"], int(i["thresholdDays"]), i["expiresAt"])
                     for e in snap.events for i in e.documents)
    expected = Counter((i["documentId"], int(i["thresholdDays"]), i["expiresAt"])
                       for items in (model.events.values() if model else ())
                       for i in items.values())
    per_day = Counter((e.owner, e.reminded_on) for e in snap.events)
    figures = {"duplicated": sum(int(n) - 1 for *_, n in snap.duplicate_markers)
               + sum(n - max(expected[k], 1) for k, n in listed.items() if n > expected[k])
               + sum(n - 1 for n in per_day.values())}
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
                     retention_days: int = 90, snap: Snapshot | None = None,
                     audit_checks: tuple[str, ...] = ("ledger_outbox",),
                     max_documents_per_event: int = events.MAX_DOCUMENTS_PER_EVENT) -> Snapshot:
    """All of (a)-(e); (d) only when a model of the clean runs is given. `retention_days`: the
    shortest retention any run used (markers older than that may have been pruned). `snap`: a
    snapshot already taken (e.g. for `tally`), checked instead of a new one. `audit_checks`
    and `max_documents_per_event` go to the one audit (check_audit)."""
    snap = check_structure(snap or snapshot(retention_days))
    check_audit(retention_days=retention_days, checks=audit_checks,
                max_documents_per_event=max_documents_per_event)
    if model is not None:
        check_matches_model(model, snap)
    assert documents_md5() == documents_before, "invariant (e) broken: person_documents changed"
    return snap


def histories_of_recorded_runs(documents: list[RefDocument], thresholds: tuple[int, ...]
                               ) -> list[ReferenceLedger]:
    """The model after every history of days the recorded runs allow an owner: each UTC day
    with a succeeded run, plus any of the days whose runs did not succeed (such a run did some
    owners whole, and left the others to a retry that may fall on the next day)."""
    runs = _rows("select as_of, status from document_expiry_reminder_runs order by started_at")
    first_as_of: dict[date, Any] = {}
    for as_of, _status in runs:
        first_as_of.setdefault(as_of.date(), as_of)
    succeeded = {as_of.date() for as_of, status in runs if status == "succeeded"}
    optional = sorted(set(first_as_of) - succeeded)
    histories = []
    for chosen in range(2 ** len(optional)):
        days = succeeded | {d for bit, d in enumerate(optional) if chosen >> bit & 1}
        model = ReferenceLedger()
        for day in sorted(days):
            model.run(documents, first_as_of[day], thresholds)
        histories.append(model)
    return histories


def check_matches_recorded_runs(documents: list[RefDocument], thresholds: tuple[int, ...],
                                snap: Snapshot | None = None) -> int:
    """(d) for cycles run on the real clock (`--loop`): every owner's markers and events are
    those of one history the recorded runs allow (`histories_of_recorded_runs`). Returns how
    many histories there were."""
    snap = snap or snapshot()
    histories = histories_of_recorded_runs(documents, thresholds)
    assert histories, "no recorded run"
    owner_of = {doc.id: doc.owner for doc in documents}
    got = _by_owner(owner_of, snap.marker_set(), snap.events_by_owner_day())
    allowed = [_by_owner(owner_of, model.marker_set(), model.events) for model in histories]
    empty: OwnerState = (frozenset(), frozenset())
    owners = set(got).union(*allowed)
    _fail("(d) owner's markers and events match no history of the recorded runs",
          sorted((o for o in owners
                  if all(got.get(o, empty) != states.get(o, empty) for states in allowed)), key=str))
    return len(histories)


def check_audit(*, retention_days: int = 90, checks: tuple[str, ...] = ("ledger_outbox",),
                max_documents_per_event: int = events.MAX_DOCUMENTS_PER_EVENT) -> None:
    """What manage.py audit_reminders says of the same data, as its role: (a) and (b) are its
    ledger_outbox check, whose findings must be none; `checks` may add left_behind after a
    loop cycle. The window reaches a day past now on either clock (faketime moves the
    worker's)."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
    with as_role(AUDITOR_ROLE):
        report = run_audit(AuditOptions(
            as_of=datetime.now(UTC) + timedelta(days=1), since=timedelta(days=30),
            outbox_retention=timedelta(days=3650), retention_days=retention_days,
            max_documents_per_event=max_documents_per_event))
    _fail(f"audit {', '.join(checks)} clean",
          [(c.name, f.code, f.count, f.ids[:3]) for c in report.checks if c.name in checks
           for f in c.findings])
