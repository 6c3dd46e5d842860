"""One reminder, one message id (docs/design.md, "One reminder, one message id"): the claim
names each outbox row after its reminder, and a reminder written again (its markers lost with a
restore or a rollback) keeps its id: a second row is never written, the claim does not fail."""

import json
import logging
import uuid
from typing import Any

import pytest
from django.db import connection

from tests.conftest import CycleRunner
from tests.support.contract import named_after
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
