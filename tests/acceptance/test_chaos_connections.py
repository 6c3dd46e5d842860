"""Lost connections: the test ends the worker's database sessions (pg_terminate_backend) in
the middle of a cycle. A single run reports the failure and exits 1, and the next run
completes; in --loop mode the worker reconnects with backoff and carries on."""

import signal
from datetime import UTC, datetime, timedelta
from functools import partial

import psycopg
import pytest

from reminders.config import DEFAULT_THRESHOLDS
from tests.support import chaos_report
from tests.support.chaos import (
    Worker,
    iso,
    load_spread_documents,
    outbox_count,
    scalar,
    terminate_worker_sessions,
    terminate_worker_waiting_on_a_lock,
    wait_until,
)
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import CycleRunner, test_database_url
from tests.support.factories import Documents
from tests.support.invariants import (
    check_invariants,
    check_matches_model,
    check_matches_recorded_runs,
    check_owner_atomicity,
    check_structure,
    documents_md5,
    snapshot,
    tally,
)
from tests.support.ledger import AS_OF, day, expiring_in
from tests.support.reference import ReferenceLedger, documents_from_database

DOCUMENTS = 6_000


@pytest.mark.slow
# On one connection as on two, the lost session fails the cycle at once, its batch's owners
# counted failed (docs/design.md §3.5), though Django has reconnected behind the lost batch.
@pytest.mark.parametrize(("claim_connections", "cuts"), [("1", ("batch",)), ("2", ("batch",))])
def test_sessions_terminated_mid_cycle_fail_the_run_and_the_next_run_completes(
    documents: Documents, claim_connections: str, cuts: tuple[str, ...],
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
        worker = Worker.start("--as-of", iso(as_of), REMINDER_BATCH_SIZE="5",
                              REMINDER_CLAIM_CONNECTIONS=claim_connections)
        # Cut the batch's session: the cycle fails with it, its batch's owners failed.
        ended: set[int] = set()
        for attempt in cuts:
            wait_until(partial(terminate_worker_waiting_on_a_lock, ended), timeout=60,
                       what=f"the worker's {attempt} to wait on the held marker")
        blocker.rollback()
        code, out = worker.finish()

    assert code == 3, worker.lines[-5:]  # the cycle's connection lost: database unavailable
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
        f"lost connections (single run, {claim_connections} claim connection(s))",
        documents=loaded, runs=2, sessions_terminated=len(ended),
        owners_failed_reported=failed_owners, owners_done_before_loss=counts.get("done", 0),
        owners_total=len(done.events), exit_codes=[code, next_code], **tally(snap, done))
    check_invariants(documents_before=before, model=done, snap=snap)
    assert_outbox_matches_contract()


def run_next(as_of: datetime) -> tuple[int, str, Worker]:
    worker = Worker.start("--as-of", iso(as_of))
    code, out = worker.finish()
    return code, out, worker


@pytest.mark.slow
@pytest.mark.real_clock
def test_loop_reconnects_with_backoff_after_its_sessions_are_terminated(
    documents: Documents,
) -> None:
    now = datetime.now(UTC)  # --loop runs as of the real clock
    loaded = load_spread_documents(DOCUMENTS, around=now, seed=12)
    before = documents_md5()
    docs = documents_from_database()

    worker = Worker.start("--loop", REMINDER_BATCH_SIZE="5", LOG_LEVEL="INFO")
    try:
        wait_until(lambda: outbox_count() >= 20, timeout=60, what="the first cycle's events")
        ended = terminate_worker_sessions()
        worker.wait_logged("sleeping until next tick", timeout=120)
        worker.proc.send_signal(signal.SIGTERM)
        code, _ = worker.finish()
    finally:
        if worker.proc.poll() is None:  # a failed wait leaves no loop sleeping until 03:00
            worker.proc.kill()
            worker.finish()

    assert code == 0, worker.lines[-5:]
    retries = worker.logged("database unavailable, retrying")
    assert retries and all(r["retry_in_s"] > 0 for r in retries)
    statuses = [e["status"] for e in worker.logged("cycle completed")]
    assert statuses[0] == "failed" and statuses[-1] == "succeeded", statuses
    assert worker.logged("loop stopped")
    check_invariants(documents_before=before)
    # The model replays every recorded run's day: a UTC midnight may fall before the retry.
    histories = check_matches_recorded_runs(docs, DEFAULT_THRESHOLDS)
    chaos_report.record(
        "lost connections (--loop)", documents=loaded, cycles=len(statuses), histories=histories,
        sessions_terminated=ended, retries=len(retries),
        retry_in_s=[r["retry_in_s"] for r in retries], statuses=statuses,
        **tally(snapshot()))
    assert_outbox_matches_contract()


def test_a_retry_after_utc_midnight_matches_a_history_of_the_recorded_runs(
    run: CycleRunner, documents: Documents,
) -> None:
    """What the --loop scenarios above check with: a cycle stopped after some owners, and its
    retry on the next UTC day, as a loop on the real clock may run them."""
    for days_left in (2, 3, 4, 5, 6):
        documents(expires_at=expiring_in(days_left))
    fake_clock = [0.0]

    def tick(_done: int, _total: int) -> None:
        fake_clock[0] += 10.0  # each batch "takes" ten seconds: the budget stops the cycle

    first = run(AS_OF, batch_size=1, max_run_duration=timedelta(seconds=25),
                clock=lambda: fake_clock[0], progress=tick)
    retry = run(day(1))
    docs = documents_from_database()

    # four batches started before the budget ran out: on two claim connections they start in
    # pairs (docs/design.md §3.9)
    assert (first.status, first.owners_notified, retry.status) == ("timed_out", 4, "succeeded")
    assert check_matches_recorded_runs(docs, DEFAULT_THRESHOLDS) == 2
    for days in ([day(1)], [AS_OF, day(1)]):  # one as-of only, or every day for every owner
        model = ReferenceLedger()
        for as_of in days:
            model.run(docs, as_of, DEFAULT_THRESHOLDS)
        with pytest.raises(AssertionError, match=r"invariant \(d\)"):
            check_matches_model(model)
    assert_outbox_matches_contract()
