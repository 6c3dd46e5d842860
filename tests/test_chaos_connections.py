"""Lost connections: the test ends the worker's database sessions (pg_terminate_backend) in
the middle of a cycle. A single run reports the failure and exits 1, and the next run
completes; in --loop mode the worker reconnects with backoff and carries on."""

import signal
from datetime import UTC, datetime
from functools import partial

import psycopg
import pytest

from reminders.config import DEFAULT_THRESHOLDS
from tests import chaos_report
from tests.chaos import (
    Worker,
    iso,
    load_spread_documents,
    outbox_count,
    scalar,
    terminate_worker_sessions,
    terminate_worker_waiting_on_a_lock,
    wait_until,
)
from tests.conftest import test_database_url
from tests.factories import Documents
from tests.invariants import (
    check_invariants,
    check_owner_atomicity,
    check_structure,
    documents_md5,
    snapshot,
    tally,
)
from tests.ledger import day
from tests.reference import ReferenceLedger, documents_from_database

DOCUMENTS = 6_000


@pytest.mark.slow
def test_sessions_terminated_mid_cycle_fail_the_run_and_the_next_run_completes(
    documents: Documents,
) -> None:
    as_of = day(-2)
    loaded = load_spread_documents(DOCUMENTS, around=as_of, seed=11)
    before = documents_md5()
    docs = documents_from_database()
    done = ReferenceLedger()
    done.run(docs, as_of, DEFAULT_THRESHOLDS)

    # Hold, uncommitted, the marker of a document some 200 documents down the urgency order:
    # the worker's claim of it waits on the unique index, inside its batch's transaction.
    [(_, doc_id, threshold)] = sorted(
        (doc.expires_at, doc.id, t) for doc in docs if doc.id in done.markers
        for t, m in done.markers[doc.id].items() if m.notified)[200:201]
    with psycopg.connect(test_database_url(), autocommit=False) as blocker:
        blocker.execute(
            "insert into profile.document_expiry_reminders (id, document_id, owner_user_id, type,"
            " threshold_days, expires_at, reminded_at, notified, run_id) values"
            " (gen_random_uuid(), %s, gen_random_uuid(), 'x', %s, now(), now(), false,"
            " gen_random_uuid())", (doc_id, threshold))
        worker = Worker.start("--as-of", iso(as_of), REMINDER_BATCH_SIZE="5")
        # Cut the batch's session; Django reconnects and the owner-by-owner retry waits on
        # the same marker: cut that one too, so the owner fails.
        ended: set[int] = set()
        for attempt in ("batch", "owner retry"):
            wait_until(partial(terminate_worker_waiting_on_a_lock, ended), timeout=60,
                       what=f"the worker's {attempt} to wait on the held marker")
        blocker.rollback()
        code, out = worker.finish()

    assert code == 1, worker.lines[-5:]
    [failed] = worker.logged("cycle failed")
    assert "connection" in failed["error"].lower() or "terminat" in failed["error"].lower()
    failed_owners = len(worker.logged("owner failed"))
    assert failed_owners >= 1 and "owner(s) failed" in worker.plain_lines()[-1], [
        (e["event"], e.get("error", "")[:80]) for e in worker.events()
        if e["event"] != "reminder queued"]
    assert scalar("select status from document_expiry_reminder_runs order by started_at limit 1") \
        == "failed"  # recorded on a fresh connection
    check_structure()
    counts = check_owner_atomicity(ReferenceLedger(), done, docs)
    assert 0 < counts.get("done", 0) < len(done.events)

    next_code, out, _ = run_next(as_of)
    assert next_code == 0, out
    snap = snapshot()
    chaos_report.record(
        "lost connections (single run)", documents=loaded, runs=2, sessions_terminated=len(ended),
        owners_failed_reported=failed_owners, owners_done_before_loss=counts.get("done", 0),
        owners_total=len(done.events), exit_codes=[code, next_code], **tally(snap, done))
    check_invariants(documents_before=before, model=done, snap=snap)


def run_next(as_of: datetime) -> tuple[int, str, Worker]:
    worker = Worker.start("--as-of", iso(as_of))
    code, out = worker.finish()
    return code, out, worker


@pytest.mark.slow
def test_loop_reconnects_with_backoff_after_its_sessions_are_terminated(
    documents: Documents,
) -> None:
    now = datetime.now(UTC)
    loaded = load_spread_documents(DOCUMENTS, around=now, seed=12)
    before = documents_md5()
    docs = documents_from_database()

    worker = Worker.start("--loop", REMINDER_BATCH_SIZE="5", LOG_LEVEL="INFO")
    wait_until(lambda: outbox_count() >= 20, timeout=60, what="the first cycle's events")
    ended = terminate_worker_sessions()
    worker.wait_logged("sleeping until next tick", timeout=120)
    worker.proc.send_signal(signal.SIGTERM)
    code, _ = worker.finish()

    assert code == 0, worker.lines[-5:]
    retries = worker.logged("database unavailable, retrying")
    assert retries and all(r["retry_in_s"] > 0 for r in retries)
    statuses = [e["status"] for e in worker.logged("cycle completed")]
    assert statuses[0] == "failed" and statuses[-1] == "succeeded", statuses
    assert worker.logged("loop stopped")
    model = ReferenceLedger()
    [last_as_of] = [scalar("select max(as_of) from document_expiry_reminder_runs"
                           " where status = 'succeeded'")]
    model.run(docs, last_as_of, DEFAULT_THRESHOLDS)
    check_invariants(documents_before=before, model=model)
    chaos_report.record(
        "lost connections (--loop)", documents=loaded, cycles=len(statuses),
        sessions_terminated=ended, retries=len(retries),
        retry_in_s=[r["retry_in_s"] for r in retries], statuses=statuses,
        **tally(snapshot(), model))
