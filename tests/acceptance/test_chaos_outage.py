"""The database down (at start, and in the middle of --loop), and SIGTERM during a cycle."""

import signal
from datetime import UTC, datetime
from itertools import pairwise

import pytest
from django.db import connection

from core.roles import WORKER_ROLE
from reminders.config import DEFAULT_THRESHOLDS
from tests.support import chaos_report
from tests.support.chaos import Worker, iso, load_spread_documents, outbox_count, scalar, wait_until
from tests.support.chaos_proxy import Proxy, refused_port
from tests.support.contract import assert_outbox_matches_contract
from tests.support.factories import Documents
from tests.support.invariants import (
    check_invariants,
    check_matches_recorded_runs,
    check_owner_atomicity,
    check_structure,
    documents_md5,
    snapshot,
    tally,
)
from tests.support.ledger import day
from tests.support.reference import ReferenceLedger, documents_from_database


def written_rows() -> int:
    return int(scalar("select (select count(*) from document_expiry_reminder_runs)"
                      " + (select count(*) from document_expiry_reminders)"
                      " + (select count(*) from outbox_messages)"))


def proxied_url(port: int) -> str:
    return f"postgres://{WORKER_ROLE}@127.0.0.1:{port}/{connection.settings_dict['NAME']}"


@pytest.mark.slow
def test_database_down_at_start_is_a_clear_error_and_writes_nothing(
    documents: Documents,
) -> None:
    documents(expires_at=day(3))

    with refused_port() as port:
        worker = Worker.start("--as-of", iso(day(0)), DATABASE_URL=proxied_url(port))
        code, _ = worker.finish()

    assert code == 3  # the database unavailable
    [failed] = worker.logged("cycle failed")
    assert "connection" in failed["error"].lower()
    [message] = worker.plain_lines()  # one line, saying what happened
    assert message.startswith("CommandError: cycle failed") and "connection" in message
    rows_written = written_rows()
    chaos_report.record("database down at start (single run)", runs=1, exit_code=code,
                        rows_written=rows_written)
    assert rows_written == 0


@pytest.mark.slow
@pytest.mark.real_clock
def test_loop_waits_out_a_database_outage_with_backoff_and_carries_on(
    documents: Documents,
) -> None:
    loaded = load_spread_documents(4_000, around=datetime.now(UTC), seed=21)  # --loop's clock
    before = documents_md5()
    docs = documents_from_database()
    db_host, db_port = connection.settings_dict["HOST"] or "127.0.0.1", connection.settings_dict["PORT"]
    proxy = Proxy((db_host, int(db_port or 5432)))

    # Down at start: retries spaced by a growing backoff, nothing written, no crash.
    worker = Worker.start("--loop", REMINDER_BATCH_SIZE="5", DATABASE_URL=proxied_url(proxy.port))
    try:
        worker.wait_logged("database unavailable, retrying", count=3, timeout=30)
        retries = worker.logged("database unavailable, retrying")[:3]
        assert [r["attempt"] for r in retries] == [1, 2, 3]
        assert 0.5 <= retries[0]["retry_in_s"] <= 1.0 and 2.0 <= retries[2]["retry_in_s"] <= 4.0
        gaps = [(datetime.fromisoformat(b["ts"]) - datetime.fromisoformat(a["ts"])).total_seconds()
                for a, b in pairwise(retries)]
        assert all(gap >= r["retry_in_s"] - 0.05 for gap, r in zip(gaps, retries, strict=False))
        assert worker.proc.poll() is None and written_rows() == 0

        # Up, then down in the middle of the cycle, then up again.
        proxy.start()
        wait_until(lambda: outbox_count() >= 20, timeout=60, what="the first cycle's events")
        retried = len(worker.logged("database unavailable, retrying"))
        proxy.stop()
        worker.wait_logged("database unavailable, retrying", count=retried + 1, timeout=30)
        check_structure()
        proxy.start()
        worker.wait_logged("sleeping until next tick", timeout=120)
        worker.proc.send_signal(signal.SIGTERM)
        code, _ = worker.finish()
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.finish()
        proxy.close()

    assert code == 0, worker.lines[-5:]
    statuses = [e["status"] for e in worker.logged("cycle completed")]
    assert statuses[-1] == "succeeded" and "failed" in statuses, statuses
    check_invariants(documents_before=before)
    # The model replays every recorded run's day: a UTC midnight may fall before the retry.
    histories = check_matches_recorded_runs(docs, DEFAULT_THRESHOLDS)
    all_retries = worker.logged("database unavailable, retrying")
    chaos_report.record(
        "database down (--loop)", documents=loaded, outages=2, retries=len(all_retries),
        histories=histories,
        retry_in_s=[r["retry_in_s"] for r in all_retries], cycles=statuses,
        connections_through_proxy=proxy.connections, **tally(snapshot()))
    assert_outbox_matches_contract()


@pytest.mark.slow
def test_sigterm_during_a_cycle_exits_0_and_the_next_run_finishes_the_day(
    documents: Documents,
) -> None:
    as_of = day(-1)
    loaded = load_spread_documents(6_000, around=as_of, seed=31)
    before = documents_md5()
    docs = documents_from_database()
    done = ReferenceLedger()
    done.run(docs, as_of, DEFAULT_THRESHOLDS)

    worker = Worker.start("--as-of", iso(as_of), REMINDER_BATCH_SIZE="5")
    wait_until(lambda: outbox_count() >= 30, timeout=60, what="the cycle's first events")
    worker.proc.send_signal(signal.SIGTERM)
    code, out = worker.finish()

    assert code == 0, worker.lines[-5:]
    assert worker.logged("stop requested") and ": stopped" in out.splitlines()[0]
    check_structure()
    counts = check_owner_atomicity(ReferenceLedger(), done, docs)
    assert 0 < counts.get("done", 0) < len(done.events)

    final = Worker.start("--as-of", iso(as_of))
    assert final.finish()[0] == 0
    snap = snapshot()
    chaos_report.record(
        "SIGTERM during a cycle", documents=loaded, runs=2, signals=1, exit_code=code,
        owners_done_before_stop=counts.get("done", 0), owners_total=len(done.events),
        half_written_owners=counts["half_written"], **tally(snap, done))
    check_invariants(documents_before=before, model=done, snap=snap)
    assert_outbox_matches_contract()
