"""One arming, one message id (docs/design.md, "One arming, one message id"): the claim names
each outbox row after its reminder and the arming its markers are in. A reminder written again
(its markers lost with a restore or a rollback) replays its arming and keeps its id: a second
row is never written, the claim does not fail. A new arming (the expiry changed, even back to
a date told before) is a new reminder under a new id. An id the outbox holds for a reminder
that says something else fails its owner, loudly, and leaves it due."""

import json
import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from prometheus_client import REGISTRY

from reminders.config import ReminderSettings
from reminders.observe import MetricsObserver
from tests.support.contract import assert_outbox_matches_contract, named_after
from tests.support.db_roles import CycleRunner
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, day, expiring_in, markers


def outbox() -> list[tuple[uuid.UUID, str, dict[str, Any], dict[str, Any]]]:
    """(id, owner, payload, headers) of every outbox row, by id."""
    with connection.cursor() as cursor:
        cursor.execute("select id, aggregate_id, payload, headers from outbox_messages order by id")
        return [(i, owner, _json(payload), _json(headers))
                for i, owner, payload, headers in cursor.fetchall()]


def _json(value: str | dict[str, Any]) -> dict[str, Any]:
    return json.loads(value) if isinstance(value, str) else value


def lose_the_ledger(*, with_the_outbox: bool = False) -> None:
    """The ledger restored (or rolled back) to before the cycle, the outbox kept or not."""
    with connection.cursor() as cursor:
        cursor.execute("delete from document_expiry_reminders")
        if with_the_outbox:
            cursor.execute("delete from outbox_messages")


def set_expiry(document_id: uuid.UUID, expires_at: datetime) -> None:
    """The profile service changes the document's expiry (a renewal, a correction)."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute("update person_documents set expires_at = %s where id = %s",
                       (expires_at, document_id))


LEDGER_COLUMNS = ("id, document_id, owner_user_id, type, threshold_days, expires_at,"
                  " reminded_at, notified, run_id, armings")


def ledger_rows() -> list[tuple[Any, ...]]:
    """The whole ledger, every column: what a backup of it holds."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute(f"select {LEDGER_COLUMNS} from document_expiry_reminders")
        return list(cursor.fetchall())


def restore_ledger(rows: list[tuple[Any, ...]]) -> None:
    """The ledger restored from `ledger_rows()` (the outbox left as it is)."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute("delete from document_expiry_reminders")
        cursor.executemany(f"insert into document_expiry_reminders ({LEDGER_COLUMNS})"
                           " values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", rows)


def lose_outbox_rows_after(instant: datetime) -> None:
    """The outbox rows written after `instant` lost (restored with the ledger)."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute("delete from outbox_messages where created_at > %s", (instant,))


def told(owner: uuid.UUID) -> list[tuple[uuid.UUID, dict[str, Any]]]:
    """(id, payload) of the owner's events, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute("select id, payload from outbox_messages where aggregate_id = %s"
                       " order by created_at, id", (str(owner),))
        return [(i, _json(payload)) for i, payload in cursor.fetchall()]


def armings(document_id: uuid.UUID) -> dict[int, int]:
    """threshold -> the arming its marker is in."""
    with connection.cursor() as cursor:
        cursor.execute("select threshold_days, armings from document_expiry_reminders"
                       " where document_id = %s", (document_id,))
        return dict(cursor.fetchall())


def already_queued_in_runs() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("select owners_already_queued from document_expiry_reminder_runs"
                       " order by started_at")
        return [r[0] for r in cursor.fetchall()]


def test_each_event_is_named_after_its_reminder(run: CycleRunner, documents: Documents) -> None:
    owner = uuid.uuid4()
    for days in (25, 6, -1):
        documents(owner_user_id=owner, expires_at=expiring_in(days))
    documents(expires_at=expiring_in(7))
    documents(expires_at=expiring_in(0))

    run(AS_OF)

    rows = outbox()
    assert len(rows) == 3
    for row_id, owner_id, payload, headers in rows:
        assert payload["ownerUserId"] == owner_id and row_id == named_after(payload)
        assert headers["message_id"] == str(row_id)
    assert_outbox_matches_contract()


def test_a_reminder_written_again_keeps_its_id_and_the_outbox_keeps_one_row(
    run: CycleRunner, documents: Documents, caplog: pytest.LogCaptureFixture,
) -> None:
    queued = [documents(expires_at=expiring_in(days)) for days in (7, 5, -2)]
    first = run(AS_OF)
    before = outbox()
    marked = markers()
    lose_the_ledger()
    newcomer = documents(expires_at=expiring_in(1))
    caplog.clear()

    with caplog.at_level(logging.INFO, logger="reminders"):
        again = run(AS_OF)

    assert (again.status, again.failed_owners) == ("succeeded", 0)
    assert again.owners_already_queued == len(queued) == first.owners_notified
    assert (again.owners_notified, again.reminders_sent) == (1, 1)  # the newcomer only
    assert markers() >= marked  # the markers are written again: the reminders are done
    after = outbox()
    assert [r for r in after if r[1] != str(newcomer.owner_user_id)] == before
    # the `reminder queued` lines (a record a batch, its items a line each: core.logs)
    logged = "".join(str(list(getattr(r, "fields", {}).get("each", []))) for r in caplog.records
                     if r.getMessage() == "reminder queued")
    assert str(newcomer.owner_user_id) in logged
    assert not any(str(doc.owner_user_id) in logged for doc in queued)
    assert any(r.getMessage() == "reminders already queued" and r.levelno == logging.WARNING
               for r in caplog.records)
    assert already_queued_in_runs() == [0, len(queued)]
    assert_outbox_matches_contract()


def test_a_reminder_lost_with_its_outbox_row_is_written_again_under_the_same_id(
    run: CycleRunner, documents: Documents,
) -> None:
    for days in (5, 6):  # t* = 7 today and tomorrow
        documents(expires_at=expiring_in(days))
    run(AS_OF)
    before = {r[0]: r[2] for r in outbox()}
    lose_the_ledger(with_the_outbox=True)

    again = run(day(1))  # the lost day, written again a day later

    after = {r[0]: r[2] for r in outbox()}
    assert (again.owners_notified, again.owners_already_queued) == (2, 0)
    assert set(after) == set(before)
    # a redelivery: the same items; the cycle's date and the days left are the new cycle's
    assert {i: [d["daysLeft"] for d in after[i]["documents"]] for i in after} == {
        i: [d["daysLeft"] - 1 for d in before[i]["documents"]] for i in before}
    assert_outbox_matches_contract()


# A, B, A (and B again): each day the expiry is corrected, 5 or 6 days ahead of AS_OF's date
A, B = expiring_in(5), expiring_in(6)


@pytest.mark.parametrize("dates", [[A, B, A], [A, B, A, B]], ids=["A-B-A", "A-B-A-B"])
def test_an_expiry_corrected_back_and_forth_tells_each_arming_once_under_its_own_id(
    run: CycleRunner, documents: Documents, dates: list[datetime],
) -> None:
    doc = documents(expires_at=dates[0])

    for offset, expires in enumerate(dates):
        set_expiry(doc.id, expires)
        result = run(day(offset))
        assert (result.owners_notified, result.reminders_sent, result.owners_already_queued,
                result.failed_owners) == (1, 1, 0, 0), f"day {offset}"
        again = run(day(offset) + timedelta(hours=1))  # the same arming: told once
        assert (again.due_documents, again.owners_notified) == (0, 0), f"day {offset}"

    events = told(doc.owner_user_id)
    # every arming told (before: the id of A's second arming was A's first, and its event was
    # dropped as already queued: the investor's last word said B)
    assert [(body["documents"][0]["thresholdDays"], body["documents"][0]["expiresAt"])
            for _, body in events] == [(7, d.date().isoformat()) for d in dates]
    # each under its own id, named after its arming: 30 and 7 re-armed each day
    ids = [message_id for message_id, _ in events]
    assert len(set(ids)) == len(dates)
    assert ids == [named_after(body, {(str(doc.id), 7): arming})
                   for arming, (_, body) in enumerate(events, start=1)]
    assert ids[0] == named_after(events[0][1])  # a first arming is named as before armings
    assert armings(doc.id) == {30: len(dates), 7: len(dates)}
    assert_outbox_matches_contract()


def test_a_restore_replays_each_arming_under_the_id_it_had(
    run: CycleRunner, documents: Documents,
) -> None:
    dates = [A, B, A, B]
    doc = documents(expires_at=A)
    run(day(0))
    backup = ledger_rows()  # last night's backup: the first arming told
    [(_, first)] = told(doc.owner_user_id)
    for offset, expires in enumerate(dates[1:], start=1):
        set_expiry(doc.id, expires)
        run(day(offset))
    original = told(doc.owner_user_id)

    # The database restored from the backup (the ledger and the outbox: the later rows lost),
    # and the same corrections replayed, each a little later: every arming again under its id
    restore_ledger(backup)
    lose_outbox_rows_after(datetime.fromisoformat(_created_at(original[0][0])))
    set_expiry(doc.id, A)
    for offset, expires in enumerate(dates[1:], start=1):
        set_expiry(doc.id, expires)
        replayed = run(day(offset) + timedelta(hours=2))
        assert (replayed.owners_notified, replayed.owners_already_queued) == (1, 0)
    assert [i for i, _ in told(doc.owner_user_id)] == [i for i, _ in original]
    assert told(doc.owner_user_id)[0][1] == first

    # The ledger alone restored (the outbox kept every row): each arming is already queued,
    # never written again, never refused
    restore_ledger(backup)
    set_expiry(doc.id, A)
    for offset, expires in enumerate(dates[1:], start=1):
        set_expiry(doc.id, expires)
        replayed = run(day(offset) + timedelta(hours=3))
        assert (replayed.owners_notified, replayed.owners_already_queued,
                replayed.failed_owners) == (0, 1, 0)
    assert [i for i, _ in told(doc.owner_user_id)] == [i for i, _ in original]
    assert armings(doc.id) == {30: 4, 7: 4}
    assert_outbox_matches_contract()


def _created_at(message_id: uuid.UUID) -> str:
    with connection.cursor() as cursor:
        cursor.execute("select created_at::text from outbox_messages where id = %s", (message_id,))
        [(created,)] = cursor.fetchall()
        return str(created)


def errors_counted() -> float:
    return REGISTRY.get_sample_value("profile_document_expiry_reminder_errors_total") or 0.0


def test_an_id_the_outbox_holds_for_a_reminder_that_says_otherwise_fails_its_owner(
    run: CycleRunner, documents: Documents, caplog: pytest.LogCaptureFixture,
) -> None:
    refused = documents(expires_at=expiring_in(5))
    replayed = documents(expires_at=expiring_in(6))
    run(AS_OF)
    before = outbox()
    [taken] = [r[0] for r in before if r[1] == str(refused.owner_user_id)]
    # the row under the refused owner's id says another number mask than the document's (as if
    # the id named two reminders); the other owner's row is the same reminder
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute("update outbox_messages set payload = jsonb_set(payload,"
                       " '{documents,0,numberMask}', '\"99 ** ****99\"') where id = %s", (taken,))
    tampered = outbox()
    lose_the_ledger()
    observer = MetricsObserver(ReminderSettings())
    errors = errors_counted()
    caplog.clear()

    with caplog.at_level(logging.INFO, logger="reminders"):
        again = run(AS_OF + timedelta(hours=2), observer=observer)  # a later remindedAt

    # never silently dropped: the owner failed, counted and logged; the other one, whose stored
    # body differs only in remindedAt and daysLeft, is the normal replay (already queued)
    assert (again.status, again.failed_owners, again.owners_already_queued,
            again.owners_notified) == ("partial", 1, 1, 0)
    assert errors_counted() == errors + 1
    [failed] = [r.__dict__["fields"] for r in caplog.records if r.getMessage() == "owner failed"]
    assert failed["owner_user_id"] == refused.owner_user_id
    assert failed["error"].startswith(
        f"UniqueViolation: message id {taken} is in the outbox with another payload")
    assert "99 **" not in caplog.text and "numberMask" not in caplog.text
    # nothing written for it: its markers rolled back, so it stays due and is tried again
    assert markers(refused.id) == set() and markers(replayed.id)
    assert outbox() == tampered
    assert run(AS_OF + timedelta(hours=3)).failed_owners == 1
    assert_outbox_matches_contract()
