"""The rules run in SQL inside the claim statement (store.claim_batch). They must decide as
reminders.rules.decide does, for every days-left in the window and every set of markers
already there, at any batch size; and the dry run, which runs rules.decide, must agree. The
independent reference model (tests/reference.py) is a second oracle on the same grid."""

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import chain, combinations

import pytest
from django.db import connection

from reminders import rules
from tests.conftest import CycleRunner
from tests.factories import Documents, DocumentSpec
from tests.invariants import check_matches_model
from tests.ledger import AS_OF, TODAY, Marker, events, expiring_in, markers
from tests.reference import ReferenceLedger, RefMarker, documents_from_database

THRESHOLDS = (30, 14, 7, 1, 0)
DAYS_LEFT = (-90, -3, 0, 1, 2, 7, 8, 13, 14, 15, 29, 30)
DOCUMENTS_PER_OWNER = 3


def _subsets(values: tuple[int, ...]) -> list[tuple[int, ...]]:
    return list(chain.from_iterable(combinations(values, n) for n in range(len(values) + 1)))


def _insert_markers(doc: DocumentSpec, thresholds: tuple[int, ...]) -> None:
    assert doc.expires_at is not None
    with connection.cursor() as cursor:
        for threshold in thresholds:
            cursor.execute(
                "insert into document_expiry_reminders (id, document_id, owner_user_id, type,"
                " threshold_days, expires_at, reminded_at, notified, run_id)"
                " values (%s, %s, %s, %s, %s, %s, %s, false, %s)",
                (uuid.uuid4(), doc.id, doc.owner_user_id, doc.type, threshold,
                 doc.expires_at.astimezone(UTC).date(), datetime(2026, 1, 1, tzinfo=UTC),
                 uuid.uuid4()),
            )


def _grid(documents: Documents) -> list[tuple[DocumentSpec, tuple[int, ...]]]:
    """One document per (days left, markers already there), three documents per owner."""
    grid: list[tuple[DocumentSpec, tuple[int, ...]]] = []
    owner = uuid.uuid4()
    for left in DAYS_LEFT:
        for marked in _subsets(THRESHOLDS):
            if len(grid) % DOCUMENTS_PER_OWNER == 0:
                owner = uuid.uuid4()
            doc = documents(expires_at=expiring_in(left), owner_user_id=owner)
            _insert_markers(doc, marked)
            grid.append((doc, marked))
    return grid


@pytest.mark.parametrize("batch_size", [1, 7, 500])
def test_claim_statement_decides_as_the_pure_rules(
    run: CycleRunner, documents: Documents, batch_size: int
) -> None:
    grid = _grid(documents)
    before = markers()
    expected_markers: set[Marker] = set()
    expected_items: dict[str, dict[str, tuple[int, int]]] = {}
    for doc, marked in grid:
        assert doc.expires_at is not None
        decision = rules.decide(doc.expires_at.date(), TODAY, THRESHOLDS, marked)
        if decision is None:
            continue
        expected_markers |= {Marker(doc.id, t, t == decision.notify) for t in decision.markers}
        if decision.notify is not None:
            expected_items.setdefault(str(doc.owner_user_id), {})[str(doc.id)] = (
                decision.notify, decision.days_left)

    planned = run(AS_OF, thresholds=THRESHOLDS, batch_size=batch_size, dry_run=True)
    result = run(AS_OF, thresholds=THRESHOLDS, batch_size=batch_size)

    assert markers() - before == expected_markers
    got = {e["ownerUserId"]: {d["documentId"]: (d["thresholdDays"], d["daysLeft"])
                              for d in e["documents"]} for e in events()}
    assert len(events()) == len(got)  # one event per owner
    assert got == expected_items
    assert result.window_documents == len(grid)
    assert result.due_documents == sum(
        1 for doc, marked in grid
        if doc.expires_at is not None
        and rules.decide(doc.expires_at.date(), TODAY, THRESHOLDS, marked) is not None)
    assert result.markers_written == len(expected_markers)
    assert result.reminders_sent == sum(len(items) for items in expected_items.values())
    assert Counter(result.reminders_by_threshold) == Counter(
        t for items in expected_items.values() for t, _ in items.values())
    assert (planned.due_documents, planned.markers_written, planned.owners_notified,
            dict(planned.reminders_by_threshold)) == (
        result.due_documents, result.markers_written, result.owners_notified,
        dict(result.reminders_by_threshold))

    # A second oracle, written from the design apart from reminders.rules: a mistake shared by
    # rules.decide and the SQL would pass everything above, not this.
    model = ReferenceLedger()
    for doc, marked in grid:
        assert doc.expires_at is not None
        model.markers[doc.id] = {t: RefMarker(notified=False,
                                              expiry_day=doc.expires_at.astimezone(UTC).date())
                                 for t in marked}
    model.run(documents_from_database(), AS_OF, THRESHOLDS)
    check_matches_model(model)


def test_window_census_counts_marked_documents_as_skipped(
    run: CycleRunner, documents: Documents
) -> None:
    done = documents(expires_at=expiring_in(5))
    _insert_markers(done, (30, 7))
    half = documents(expires_at=expiring_in(5))
    _insert_markers(half, (30,))
    documents(expires_at=expiring_in(20))
    documents(expires_at=expiring_in(31))  # outside the window

    result = run(AS_OF)

    assert (result.window_documents, result.due_documents, result.skipped_already_marked) == (
        3, 2, 1)
    assert run(AS_OF + timedelta(hours=1)).due_documents == 0
