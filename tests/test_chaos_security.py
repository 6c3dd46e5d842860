"""Security: the worker's role cannot read the encrypted payload or write the documents, while a
full cycle succeeds under it; and a full run, at DEBUG, logs no number mask, payload or cipher
(not even in the error of a failing owner)."""

import uuid

import psycopg
import pytest
from django.db import connection
from psycopg import errors

from reminders.devdb import WORKER_ROLE
from tests import chaos_report
from tests.chaos import Worker, iso
from tests.conftest import test_database_url
from tests.factories import Documents, DocumentSpec, insert_documents
from tests.invariants import check_invariants, documents_md5
from tests.ledger import day
from tests.reference import ReferenceLedger, documents_from_database

FORBIDDEN = [
    "select payload_cipher from profile.person_documents limit 1",
    "select * from profile.person_documents limit 1",
    "select count(payload_cipher) from profile.person_documents",
    "update profile.person_documents set type = type",
    "update profile.person_documents set number_mask = 'x' where false",
    "insert into profile.person_documents (id, owner_user_id, person_id, type, status,"
    " payload_cipher, created_at, updated_at) values (gen_random_uuid(), gen_random_uuid(),"
    " gen_random_uuid(), 'Visa', 'Active', '\\x00', now(), now())",
    "delete from profile.person_documents",
    "truncate profile.person_documents",
    "select payload from profile.outbox_messages limit 1",
    "copy profile.person_documents to stdout",
]


def test_worker_role_cannot_read_the_cipher_or_write_documents_yet_a_cycle_succeeds(
    documents: Documents,
) -> None:
    docs = [documents(expires_at=day(d)) for d in (-3, 0, 5, 20)]
    before = documents_md5()
    refused = 0
    with psycopg.connect(test_database_url(WORKER_ROLE), autocommit=True) as conn:
        [(role,)] = conn.execute("select current_user").fetchall()
        assert role == WORKER_ROLE
        for sql in FORBIDDEN:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(sql)
            refused += 1
        # What it may do: the open columns, for the rules.
        rows = conn.execute("select id, number_mask from profile.person_documents").fetchall()
        assert len(rows) == len(docs)

    worker = Worker.start("--as-of", iso(day(0)))
    code, _ = worker.finish()

    assert code == 0, worker.lines[-5:]
    model = ReferenceLedger()
    model.run(documents_from_database(), day(0), (30, 7, 1, 0))
    unchanged = documents_md5() == before
    chaos_report.record("security (least-privilege worker role)", statements_refused=refused,
                        cycle_exit_code=code, reminders=model.reminders(),
                        documents_unchanged=unchanged)
    check_invariants(documents_before=before, model=model)


def test_a_full_run_at_debug_logs_no_mask_payload_or_cipher(documents: Documents) -> None:
    owners = [uuid.uuid4() for _ in range(30)]
    specs = [
        DocumentSpec(id=uuid.uuid4(), owner_user_id=owners[i % 30], person_id=uuid.uuid4(),
                     type="Passport", number_mask=f"MASK{i:03d}-{uuid.uuid4().hex[:8]}",
                     expires_at=day(i % 40 - 5),
                     payload_cipher=f"PAYLOAD-SECRET-{uuid.uuid4().hex}".encode())
        for i in range(120)
    ]
    insert_documents(specs)
    failing_owner = owners[7]
    with connection.cursor() as cursor:  # a real per-owner failure, whose error gets logged
        cursor.execute(f"alter table outbox_messages add constraint chaos_refuse_one_owner"
                       f" check (aggregate_id <> '{failing_owner}')")
    try:
        worker = Worker.start("--as-of", iso(day(0)), LOG_LEVEL="DEBUG", LOG_FORMAT="json",
                              REMINDER_BATCH_SIZE="10")
        code, out = worker.finish()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("alter table outbox_messages drop constraint chaos_refuse_one_owner")

    assert code == 1, worker.lines[-5:]  # the refused owner failed, the rest went out
    assert worker.logged("owner failed") and worker.logged("reminder queued")
    assert worker.logged("batch selected")  # DEBUG lines were on
    assert len(worker.events()) == len(worker.lines) - len(worker.plain_lines())
    everything = "\n".join(worker.lines) + out
    leaks = []
    checked = 0
    for spec in specs:
        assert spec.number_mask is not None
        secrets = [spec.number_mask, spec.payload_cipher.decode(), spec.payload_cipher.hex(),
                   "\\x" + spec.payload_cipher.hex()]
        leaks += [s for s in secrets if s in everything]
        checked += len(secrets)
    chaos_report.record("log audit (full run, DEBUG, one failing owner)",
                        log_lines=len(worker.lines), documents=len(specs),
                        secrets_checked=checked, leaks=len(leaks))
    assert leaks == []
    assert "payload_cipher" not in everything and "numberMask" not in everything
