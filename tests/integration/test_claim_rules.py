"""The rules run in SQL inside the claim statement (store.claim_batch). They must decide as
reminders.rules.decide does, for every days-left in the window and every set of markers
already there (of the current expiry date, or of an earlier one), at any batch size; and the
dry run, which runs rules.decide, must agree. The independent reference model
(tests/support/reference.py) is a second oracle on the same grid."""

import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from itertools import chain, combinations

import pytest
from django.db import connection

from devtools.demo_data import PersonDocument
from reminders import rules
from reminders.result import CycleResult
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner
from tests.support.factories import Documents
from tests.support.invariants import check_matches_model
from tests.support.ledger import AS_OF, TODAY, Marker, events, expiring_in
from tests.support.reference import ReferenceLedger, RefMarker, documents_from_database

THRESHOLDS = (30, 14, 7, 1, 0)
DAYS_LEFT = (-90, -3, 0, 1, 2, 7, 8, 13, 14, 15, 29, 30)
DOCUMENTS_PER_OWNER = 3
RENEWED_FROM = timedelta(days=-45)  # a stale marker's date, relative to the current one


def _subsets(values: tuple[int, ...]) -> list[tuple[int, ...]]:
    return list(chain.from_iterable(combinations(values, n) for n in range(len(values) + 1)))


def _insert_markers(doc: PersonDocument, markers: dict[int, date]) -> None:
    with connection.cursor() as cursor:
        for threshold, expires_on in markers.items():
            cursor.execute(
                "insert into document_expiry_reminders (id, document_id, owner_user_id, type,"
                " threshold_days, expires_at, reminded_at, notified, run_id)"
                " values (%s, %s, %s, %s, %s, %s, %s, false, %s)",
                (uuid.uuid4(), doc.id, doc.owner_user_id, doc.type, threshold,
                 expires_on, datetime(2026, 1, 1, tzinfo=UTC), uuid.uuid4()),
            )


def _current(doc: PersonDocument, thresholds: tuple[int, ...]) -> dict[int, date]:
    assert doc.expires_at is not None
    return dict.fromkeys(thresholds, doc.expires_at.astimezone(UTC).date())


def _variants(marked: tuple[int, ...], expires_on: date, turn: int) -> list[dict[int, date]]:
    """The markers `marked` all of the current date, and then (by `turn`) all of them or
    every other one stale."""
    stale = expires_on + RENEWED_FROM
    current = dict.fromkeys(marked, expires_on)
    renewed = (dict.fromkeys(marked, stale) if turn % 2 else
               {t: stale if i % 2 == 0 else expires_on for i, t in enumerate(marked)})
    return [current] if renewed == current else [current, renewed]


def _grid(documents: Documents) -> list[tuple[PersonDocument, dict[int, date]]]:
    """One document per (days left, markers already there and the date each was written for),
    three documents per owner."""
    grid: list[tuple[PersonDocument, dict[int, date]]] = []
    owner = uuid.uuid4()
    for left in DAYS_LEFT:
        expires_at = expiring_in(left)
        for turn, marked in enumerate(_subsets(THRESHOLDS)):
            for markers in _variants(marked, expires_at.date(), turn):
                if len(grid) % DOCUMENTS_PER_OWNER == 0:
                    owner = uuid.uuid4()
                doc = documents(expires_at=expires_at, owner_user_id=owner)
                _insert_markers(doc, markers)
                grid.append((doc, markers))
    return grid


@pytest.mark.parametrize("batch_size", [1, 7, 500])
def test_claim_statement_decides_as_the_pure_rules(
    run: CycleRunner, documents: Documents, batch_size: int
) -> None:
    grid = _grid(documents)
    expected = _decided_by_the_rules(grid)

    planned = run(AS_OF, thresholds=THRESHOLDS, batch_size=batch_size, dry_run=True)
    result = run(AS_OF, thresholds=THRESHOLDS, batch_size=batch_size)

    _check_the_cycle_wrote_what_the_rules_decide(grid, expected, result, planned)
    _check_the_dry_run_planned_what_the_cycle_did(planned, result)
    _check_the_reference_model_agrees(grid)
    assert_outbox_matches_contract()


@dataclass
class _Decided:
    """What rules.decide makes of the grid."""

    # (document, threshold) -> (the marker's expiry date, notified): the grid's markers, then
    # the decisions' markers over them (a new marker, or a stale one re-armed in place)
    ledger: dict[tuple[uuid.UUID, int], tuple[date, bool]]
    markers: set[Marker] = field(default_factory=set)
    # owner -> document -> (threshold notified, days left)
    items: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    rearmed: int = 0


def _decided_by_the_rules(grid: list[tuple[PersonDocument, dict[int, date]]]) -> _Decided:
    expected = _Decided(ledger={(doc.id, t): (on, False) for doc, marked in grid
                                for t, on in marked.items()})
    for doc, marked in grid:
        assert doc.expires_at is not None
        decision = rules.decide(doc.expires_at.date(), TODAY, THRESHOLDS, marked)
        if decision is None:
            continue
        expected.markers |= {Marker(doc.id, t, t == decision.notify) for t in decision.markers}
        expected.ledger |= {(doc.id, t): (doc.expires_at.date(), t == decision.notify)
                            for t in decision.markers}
        expected.rearmed += len(decision.rearmed)
        if decision.notify is not None:
            expected.items.setdefault(str(doc.owner_user_id), {})[str(doc.id)] = (
                decision.notify, decision.days_left)
    return expected


def _check_the_cycle_wrote_what_the_rules_decide(
    grid: list[tuple[PersonDocument, dict[int, date]]], expected: _Decided,
    result: CycleResult, planned: CycleResult,
) -> None:
    assert expected.rearmed > 0  # the grid has stale markers that the rules replace
    assert _ledger() == expected.ledger
    got = {e["ownerUserId"]: {d["documentId"]: (d["thresholdDays"], d["daysLeft"])
                              for d in e["documents"]} for e in events()}
    assert len(events()) == len(got)  # one event per owner
    assert got == expected.items
    assert result.window_documents == len(grid)
    assert result.due_documents == sum(
        1 for doc, marked in grid
        if doc.expires_at is not None
        and rules.decide(doc.expires_at.date(), TODAY, THRESHOLDS, marked) is not None)
    assert result.markers_written == len(expected.markers)
    assert result.markers_rearmed == planned.markers_rearmed == expected.rearmed
    assert result.reminders_sent == sum(len(items) for items in expected.items.values())
    assert Counter(result.reminders_by_threshold) == Counter(
        t for items in expected.items.values() for t, _ in items.values())


def _check_the_dry_run_planned_what_the_cycle_did(planned: CycleResult,
                                                  result: CycleResult) -> None:
    assert (planned.due_documents, planned.markers_written, planned.owners_notified,
            dict(planned.reminders_by_threshold)) == (
        result.due_documents, result.markers_written, result.owners_notified,
        dict(result.reminders_by_threshold))


def _check_the_reference_model_agrees(grid: list[tuple[PersonDocument, dict[int, date]]]) -> None:
    """A second oracle, written from the design apart from reminders.rules: a mistake shared by
    rules.decide and the SQL would pass the checks above, not this."""
    model = ReferenceLedger()
    for doc, marked in grid:
        # each grid marker answers for its own date (a stale one for an earlier expiry)
        model.markers[doc.id] = {t: RefMarker(notified=False, expiry_day=on)
                                 for t, on in marked.items()}
    model.run(documents_from_database(), AS_OF, THRESHOLDS)
    check_matches_model(model)


def _ledger() -> dict[tuple[uuid.UUID, int], tuple[date, bool]]:
    with connection.cursor() as cursor:
        cursor.execute("select document_id, threshold_days, expires_at, notified"
                       " from document_expiry_reminders")
        return {(d, t): (on, n) for d, t, on, n in cursor.fetchall()}


def test_window_census_counts_marked_documents_as_skipped(
    run: CycleRunner, documents: Documents
) -> None:
    done = documents(expires_at=expiring_in(5))
    _insert_markers(done, _current(done, (30, 7)))
    half = documents(expires_at=expiring_in(5))
    _insert_markers(half, _current(half, (30,)))
    renewed = documents(expires_at=expiring_in(5))  # its markers answer for an earlier date
    _insert_markers(renewed, dict.fromkeys((30, 7), TODAY - timedelta(days=20)))
    documents(expires_at=expiring_in(20))
    documents(expires_at=expiring_in(31))  # outside the window

    result = run(AS_OF)

    assert (result.window_documents, result.due_documents, result.skipped_already_marked) == (
        4, 3, 1)
    assert run(AS_OF + timedelta(hours=1)).due_documents == 0
    assert_outbox_matches_contract()
