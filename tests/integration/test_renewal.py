"""Renewal re-arms (docs/design.md §3.2): a marker answers only for the expiry date it was
written for. Each case is a sequence of daily cycles on one document whose expiry changes
on one day; the test lists when each reminder arrives."""

import uuid
from datetime import UTC, date, datetime

from django.db import connection

from reminders.models import ReminderRun
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner
from tests.support.factories import Documents
from tests.support.ledger import TODAY, day, events, expiring_in

# (day of the cycle, thresholdDays, daysLeft, expiresAt): one reminder as it arrived
Arrival = tuple[int, int, int, str]


def _set_expiry(document_id: uuid.UUID, expires_at: datetime) -> None:
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute("update person_documents set expires_at = %s where id = %s",
                       (expires_at, document_id))


def daily_reminders(run: CycleRunner, document_id: uuid.UUID, last_day: int,
                    changes: dict[int, datetime]) -> list[Arrival]:
    """Cycles at day(0) .. day(last_day); before the cycle of day k the expiry becomes
    changes[k]. The reminders of the document, in the order they arrived."""
    for offset in range(last_day + 1):
        if offset in changes:
            _set_expiry(document_id, changes[offset])
        assert run(day(offset)).status == ReminderRun.Status.SUCCEEDED
    return [
        ((date.fromisoformat(e["remindedAt"][:10]) - TODAY).days, d["thresholdDays"],
         d["daysLeft"], d["expiresAt"])
        for e in events() for d in e["documents"] if d["documentId"] == str(document_id)
    ]


def ledger(document_id: uuid.UUID) -> set[tuple[int, date, bool]]:
    """(threshold, marker's expiry date, notified) of the document's markers."""
    with connection.cursor() as cursor:
        cursor.execute("select threshold_days, expires_at, notified"
                       " from document_expiry_reminders where document_id = %s", (document_id,))
        return set(cursor.fetchall())


def rearmed_in_history() -> int:
    return sum(ReminderRun.objects.values_list("markers_rearmed", flat=True))


def _on(offset: int) -> str:
    return expiring_in(offset).astimezone(UTC).date().isoformat()


def test_expired_then_renewed_by_60_days_is_reminded_before_its_new_expiry(
    run: CycleRunner, documents: Documents
) -> None:
    doc = documents(expires_at=expiring_in(5))

    arrivals = daily_reminders(run, doc.id, 100, {6: expiring_in(65)})

    # Before: nothing until day 97, a 0-day reminder 32 days after the new expiry.
    assert arrivals == [
        (0, 7, 5, _on(5)), (4, 1, 1, _on(5)), (5, 0, 0, _on(5)),
        (35, 30, 30, _on(65)), (58, 7, 7, _on(65)), (64, 1, 1, _on(65)), (65, 0, 0, _on(65)),
    ]
    new_expiry = date.fromisoformat(_on(65))
    assert ledger(doc.id) == {(30, new_expiry, True), (7, new_expiry, True),
                              (1, new_expiry, True), (0, new_expiry, True)}
    assert rearmed_in_history() == 4
    assert_outbox_matches_contract()


def test_renewed_by_30_days_after_its_7_day_reminder_gets_the_new_30_and_7(
    run: CycleRunner, documents: Documents
) -> None:
    doc = documents(expires_at=expiring_in(10))

    arrivals = daily_reminders(run, doc.id, 45, {4: expiring_in(40)})

    # Before: the new 30-day and 7-day reminders were suppressed.
    assert arrivals == [
        (0, 30, 10, _on(10)), (3, 7, 7, _on(10)),
        (10, 30, 30, _on(40)), (33, 7, 7, _on(40)), (39, 1, 1, _on(40)), (40, 0, 0, _on(40)),
    ]
    assert rearmed_in_history() == 2  # 30 and 7; 1 and 0 were never marked for the old date
    assert_outbox_matches_contract()


def test_expired_then_renewed_by_100_days_gets_its_30_day_reminder_at_30_days(
    run: CycleRunner, documents: Documents
) -> None:
    doc = documents(expires_at=expiring_in(5))

    arrivals = daily_reminders(run, doc.id, 106, {6: expiring_in(105)})

    # Before: the 30-day reminder came on day 97, with 8 days left.
    assert arrivals == [
        (0, 7, 5, _on(5)), (4, 1, 1, _on(5)), (5, 0, 0, _on(5)),
        (75, 30, 30, _on(105)), (98, 7, 7, _on(105)), (104, 1, 1, _on(105)),
        (105, 0, 0, _on(105)),
    ]
    # 30 re-armed on day 75; the old 7, 1 and 0 were pruned on day 96 (their date left the
    # 90-day retention), so the new ones are plain inserts.
    assert rearmed_in_history() == 1
    assert {e for _t, e, _n in ledger(doc.id)} == {date.fromisoformat(_on(105))}
    assert_outbox_matches_contract()


def test_expiry_corrected_to_an_earlier_date_after_its_30_day_reminder(
    run: CycleRunner, documents: Documents
) -> None:
    doc = documents(expires_at=expiring_in(30))

    arrivals = daily_reminders(run, doc.id, 21, {1: expiring_in(20)})

    # The investor was told the wrong date: told again at once with the corrected one.
    assert arrivals == [
        (0, 30, 30, _on(30)),
        (1, 30, 19, _on(20)), (13, 7, 7, _on(20)), (19, 1, 1, _on(20)), (20, 0, 0, _on(20)),
    ]
    corrected = date.fromisoformat(_on(20))
    assert {(t, e) for t, e, _n in ledger(doc.id)} == {
        (30, corrected), (7, corrected), (1, corrected), (0, corrected)}
    assert rearmed_in_history() == 1
    assert_outbox_matches_contract()


def test_corrected_to_an_earlier_date_past_two_thresholds_tells_the_most_urgent_once(
    run: CycleRunner, documents: Documents
) -> None:
    doc = documents(expires_at=expiring_in(30))
    run(day(0))  # 30 told for the old date
    _set_expiry(doc.id, expiring_in(5))

    result = run(day(1))  # 4 days left: 30 re-armed silently, 7 new and told

    assert (result.markers_written, result.markers_rearmed, result.reminders_sent) == (2, 1, 1)
    on = date.fromisoformat(_on(5))
    assert ledger(doc.id) == {(30, on, False), (7, on, True)}
    assert [(d["thresholdDays"], d["expiresAt"]) for d in events()[-1]["documents"]] == [
        (7, _on(5))]
    assert_outbox_matches_contract()


def test_an_unchanged_expiry_is_never_rewritten(run: CycleRunner, documents: Documents) -> None:
    doc = documents(expires_at=expiring_in(5))
    run(day(0))
    with connection.cursor() as cursor:
        cursor.execute("select id, run_id, reminded_at from document_expiry_reminders"
                       " where document_id = %s order by threshold_days", (doc.id,))
        before = cursor.fetchall()
    # Same UTC date, another time of day: the same expiry for the rules.
    _set_expiry(doc.id, expiring_in(5).replace(hour=23))

    again = run(day(0))
    next_day = run(day(1))

    with connection.cursor() as cursor:
        cursor.execute("select id, run_id, reminded_at from document_expiry_reminders"
                       " where document_id = %s order by threshold_days", (doc.id,))
        assert cursor.fetchall() == before
    assert (again.markers_written, next_day.markers_written, next_day.markers_rearmed) == (0, 0, 0)
    assert_outbox_matches_contract()


def test_a_stale_marker_does_not_make_the_new_expiry_silent(
    run: CycleRunner, documents: Documents
) -> None:
    # Markers 30, 7, 1, 0 of an old date: the stale rule must not read them as "told more
    # urgently", or the renewed document's 30-day reminder would go out silently.
    doc = documents(expires_at=expiring_in(-2))
    run(day(0))
    _set_expiry(doc.id, expiring_in(25))

    result = run(day(1))

    assert (result.reminders_sent, result.markers_rearmed, result.due_documents) == (1, 1, 1)
    assert events()[-1]["documents"][0]["thresholdDays"] == 30
    assert_outbox_matches_contract()


def test_the_census_and_the_dry_run_count_a_renewed_document_as_due(
    run: CycleRunner, documents: Documents
) -> None:
    doc = documents(expires_at=expiring_in(-2))
    run(day(0))
    _set_expiry(doc.id, expiring_in(25))

    planned = run(day(1), dry_run=True)
    result = run(day(1))

    assert (planned.due_documents, planned.markers_written, planned.markers_rearmed,
            planned.reminders_sent) == (1, 1, 1, 1)
    assert (result.due_documents, result.markers_written, result.markers_rearmed,
            result.reminders_sent) == (1, 1, 1, 1)
    assert run(day(1)).due_documents == 0
    assert_outbox_matches_contract()
