"""Bad data: odd types and masks, expiries at the extremes and on every edge, thousands of
documents for one owner, owners with nothing but archived or deleted documents. Handled by
the rules: never a crash, never a lost or doubled reminder, events within a sane size."""

import json
import subprocess
import uuid
from datetime import UTC, datetime, time, timedelta, timezone
from typing import Any

from django.db import connection

from core.roles import RELAY_ROLE, WORKER_ROLE
from devtools.demo_data import PersonDocument
from reminders.config import DEFAULT_THRESHOLDS
from reminders.events import MAX_DOCUMENTS_PER_EVENT
from reminders.models import ReminderRun
from tests.support import chaos_report
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner
from tests.support.factories import Documents, insert_documents
from tests.support.invariants import check_invariants, documents_md5, snapshot, tally
from tests.support.ledger import AS_OF, TODAY, day, events_for
from tests.support.processes import command_env, manage_py
from tests.support.reference import ReferenceLedger, documents_from_database

ODD_TYPES = ["", "UnknownType", "x" * 32, "Водительское", "🛂Passport", "Passport ", "a'b\"c\\d"]
ODD_MASKS = [None, "", " ", "४५ ** ****१२", "m" * 32, "é" * 32, "45\n**\t12", "\"}{\\u0000",
             "'; drop table outbox; --"]
OFFSETS = [timedelta(hours=h, minutes=m) for h, m in
           ((-12, 0), (-9, -30), (-5, 0), (0, 0), (3, 0), (5, 45), (14, 0))]


def spec(owner: uuid.UUID, expires_at: datetime | None, **fields: object) -> PersonDocument:
    values: dict[str, object] = {"type": "Passport", "number_mask": "45 ** ****12",
                                 "payload_cipher": uuid.uuid4().bytes, **fields}
    return PersonDocument(id=uuid.uuid4(), owner_user_id=owner, person_id=uuid.uuid4(),
                          expires_at=expires_at, **values)  # type: ignore[arg-type]


def odd_documents() -> list[PersonDocument]:
    docs = []
    owner = uuid.uuid4
    for i, kind in enumerate(ODD_TYPES):
        docs.append(spec(owner(), day(i % 9), type=kind))
    for i, mask in enumerate(ODD_MASKS):
        docs.append(spec(owner(), day(i % 31 - 3), number_mask=mask))
    first, last = TODAY - timedelta(days=90), TODAY + timedelta(days=30)
    for instant in (
        datetime(1, 1, 1, tzinfo=UTC), datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-12))),
        datetime.combine(first, time(0), tzinfo=UTC),
        datetime.combine(first, time(0), tzinfo=UTC) - timedelta(microseconds=1),
        datetime.combine(last, time(23, 59, 59, 999999), tzinfo=UTC),
        datetime.combine(last, time(23, 59, 59, 999999), tzinfo=UTC) + timedelta(microseconds=1),
        AS_OF.replace(hour=0), AS_OF.replace(hour=0) - timedelta(microseconds=1),
    ):
        docs.append(spec(owner(), instant))
    for offset in OFFSETS:  # midnight local time, on days whose UTC date crosses a threshold
        for k in (0, 1, 2, 7, 8, 30, 31):
            local_midnight = datetime.combine(TODAY + timedelta(days=k), time(0),
                                              tzinfo=timezone(offset))
            docs.append(spec(owner(), local_midnight))
    lonely = owner()  # only archived or deleted documents, all due
    docs += [spec(lonely, day(2), status="Archived"),
             spec(lonely, day(-1), deleted_at=AS_OF - timedelta(days=1)),
             spec(lonely, day(5), status="Archived", deleted_at=AS_OF)]
    return docs


def test_odd_documents_are_handled_by_the_rules(run: CycleRunner, documents: Documents) -> None:
    docs = odd_documents()
    insert_documents(docs)
    before = documents_md5()
    model = ReferenceLedger()
    reference = documents_from_database()
    offsets = (0, 1, 2, 7, 31, 95)
    for offset in offsets:
        result = run(day(offset))
        assert result.status == ReminderRun.Status.SUCCEEDED
        model.run(reference, day(offset), DEFAULT_THRESHOLDS)
        check_invariants(documents_before=before, model=model)

    # Hand-checked corners, independent of the model: midnight at +03:00 is the day before.
    plus3 = next(d for d in docs if d.expires_at == datetime.combine(
        TODAY + timedelta(days=8), time(0), tzinfo=timezone(timedelta(hours=3))))
    item = events_for(plus3.owner_user_id)[0]["documents"][0]  # the first run's
    assert (item["expiresAt"], item["daysLeft"], item["thresholdDays"]) == (
        (TODAY + timedelta(days=7)).isoformat(), 7, 7)
    minus12 = next(d for d in docs if d.expires_at == datetime.combine(
        TODAY + timedelta(days=7), time(0), tzinfo=timezone(timedelta(hours=-12))))
    item = events_for(minus12.owner_user_id)[0]["documents"][0]
    assert (item["expiresAt"], item["thresholdDays"]) == (
        (TODAY + timedelta(days=7)).isoformat(), 7)
    masks = {i["numberMask"] for e in all_payloads() for i in e["documents"]}
    assert {m for m in ODD_MASKS} <= masks  # carried verbatim, null included
    chaos_report.record(
        "bad data (odd types, masks, extreme and edge expiries, offsets)", documents=len(docs),
        runs=len(offsets), odd_types=len(ODD_TYPES), odd_masks=len(ODD_MASKS),
        utc_offsets=len(OFFSETS), reminders=sum(len(v) for v in model.events.values()),
        **tally(snapshot(), model))
    assert_outbox_matches_contract()


def all_payloads() -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute("select payload from outbox_messages")
        return [json.loads(p) if isinstance(p, str) else p for (p,) in cursor.fetchall()]


def test_an_owner_with_thousands_of_due_documents_gets_capped_events_until_all_are_told(
    run: CycleRunner, documents: Documents,
) -> None:
    owner = uuid.uuid4()
    count = 1_300
    insert_documents([spec(owner, day(-80 + i % 111) + timedelta(minutes=i),
                           number_mask=f"{i:04d} ** ****{i % 100:02d}") for i in range(count)])
    before = documents_md5()
    reference = documents_from_database()
    model = ReferenceLedger()
    sizes = []
    for offset in range(4):
        run(day(offset))
        model.run(reference, day(offset), DEFAULT_THRESHOLDS)
        check_invariants(documents_before=before, model=model)
        [event] = [e for e in all_payloads() if e["remindedAt"] == day(offset).strftime(
            "%Y-%m-%dT%H:%M:%SZ")]
        items = event["documents"]
        assert isinstance(items, list) and len(items) <= MAX_DOCUMENTS_PER_EVENT
        sizes.append((len(items), len(json.dumps(event))))
    # 500, 500, then the rest (and the day's new crossings): drained on the third day.
    assert sizes[0][0] == sizes[1][0] == MAX_DOCUMENTS_PER_EVENT > sizes[2][0]
    assert all(size < 150_000 for _, size in sizes)
    chaos_report.record(
        "bad data (one owner, thousands of documents)", documents=count, runs=len(sizes),
        cap=MAX_DOCUMENTS_PER_EVENT, event_items_and_bytes_per_day=sizes,
        reminders=sum(len(v) for v in model.events.values()), **tally(snapshot(), model))
    assert_outbox_matches_contract()



def test_a_document_type_with_a_newline_and_an_escape_stays_on_its_line_in_logs_and_reports(
    documents: Documents,
) -> None:
    forged = "Visa\n03:00:00 ERROR x\x1b[2J\x1b[31m"  # the column holds 32 characters
    documents(expires_at=day(3), type=forged)
    worker = subprocess.run([*manage_py(), "run_expiry_reminders", "--as-of", AS_OF.isoformat()],
                            env={**command_env(WORKER_ROLE), "LOG_FORMAT": "text"},
                            capture_output=True, text=True, timeout=60, check=False)
    shown = subprocess.run([*manage_py(), "show_outbox"], env=command_env(RELAY_ROLE),
                           capture_output=True, text=True, timeout=60, check=False)

    assert worker.returncode == 0, worker.stderr
    assert shown.returncode == 0, shown.stderr
    escaped = "Visa\\n03:00:00 ERROR x\\x1b[2J"
    assert escaped in worker.stderr and escaped in shown.stdout
    for output in (shown.stdout, worker.stderr):
        assert "\x1b" not in output
        assert not any(line.startswith("03:00:00 ERROR x") for line in output.splitlines())
    assert_outbox_matches_contract()
