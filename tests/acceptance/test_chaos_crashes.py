"""Crashes: SIGKILL the worker at seeded random moments of a cycle, restart it each time, then
let a run finish the day; the same day three times over, the ledger and the outbox emptied in
between. After every kill no owner is half-written; after each finished day the ledger and
the outbox are exactly what one uninterrupted run would have left.

Every moment is exercised each time: a kill in start-up (before the cycle starts), one right
after the cycle started (the census, the first batches), and kills mid-cycle, each after the
killed run committed owners of its own and before the day was done."""

import random
import signal
from functools import partial

import pytest

from reminders.config import DEFAULT_THRESHOLDS
from tests.support import chaos_report
from tests.support.chaos import Worker, iso, load_spread_documents, outbox_count, wait_until
from tests.support.contract import assert_outbox_matches_contract
from tests.support.factories import Documents
from tests.support.invariants import (
    check_invariants,
    check_owner_atomicity,
    check_structure,
    documents_md5,
    snapshot,
    tally,
)
from tests.support.ledger import day, forget_written
from tests.support.reference import ReferenceLedger, documents_from_database

DAYS = 3  # rounds of the same as-of day
KILLS_PER_DAY = 7  # one in start-up, one as the cycle starts, five mid-cycle
DOCUMENTS = 3_000  # about 950 owners a day: three whole days stay cheap
SEED = 20261129


def progressed(worker: Worker, events: int) -> bool:
    return outbox_count() >= events or worker.proc.poll() is not None


@pytest.mark.slow
def test_sigkill_at_random_moments_leaves_no_half_written_owner(documents: Documents) -> None:
    as_of = day(-3)
    loaded = load_spread_documents(DOCUMENTS, around=as_of, seed=SEED)
    before = documents_md5()
    docs = documents_from_database()
    empty = ReferenceLedger()
    done = empty.copy()
    done.run(docs, as_of, DEFAULT_THRESHOLDS)
    owners_total = len(done.events)
    rng = random.Random(SEED)

    # (moment, whether the cycle had started, owners done before the run, and after the kill)
    kills: list[tuple[str, bool, int, int]] = []
    runs = days_forgotten = half_written = 0
    figures = {"lost": 0, "duplicated": 0, "unexpected": 0}
    for today in range(DAYS):
        moments = ["start-up", "cycle start"] + ["mid-cycle"] * (KILLS_PER_DAY - 2)
        rng.shuffle(moments)
        # Where the mid-cycle kills land, as shares of the day's owners, in the order they run.
        shares = iter(sorted(rng.uniform(0.02, 0.85) for _ in range(KILLS_PER_DAY - 2)))
        owners_done = 0
        for moment in moments:
            runs += 1
            worker = Worker.start("--as-of", iso(as_of), REMINDER_BATCH_SIZE="5")
            if moment == "start-up":
                worker.wait(rng.uniform(0.01, 0.2))
            elif moment == "cycle start":
                worker.wait_logged("cycle started", timeout=60)
                worker.wait(rng.uniform(0, 0.3))
            else:
                target = max(outbox_count() + 1, int(next(shares) * owners_total))
                wait_until(partial(progressed, worker, target), timeout=60,
                           what="the worker's progress", every=0.01)
                worker.wait(rng.uniform(0, 0.03))
            assert worker.proc.poll() is None, f"the run ended before its {moment} kill"
            started = bool(worker.logged("cycle started"))
            worker.proc.send_signal(signal.SIGKILL)
            code, _ = worker.finish()
            assert code == -signal.SIGKILL, worker.lines[-5:]
            check_structure()
            counts = check_owner_atomicity(empty, done, docs)
            half_written += counts["half_written"]
            kills.append((moment, started, owners_done, counts["done"]))
            owners_done = counts["done"]
        # A run left alone finishes the day; the ledger and the outbox are then the model's.
        final = Worker.start("--as-of", iso(as_of))
        runs += 1
        assert final.finish()[0] == 0, final.lines[-5:]
        snap = snapshot()
        for name, value in tally(snap, done).items():
            figures[name] += value
        check_invariants(documents_before=before, model=done, snap=snap)
        if today < DAYS - 1:
            forget_written()  # a fresh ledger and outbox: the same day again
            days_forgotten += 1

    mid_cycle = [(b, a) for moment, _, b, a in kills if moment == "mid-cycle"]
    chaos_report.record(
        "crashes (SIGKILL)", documents=loaded, days=DAYS, days_forgotten=days_forgotten,
        runs=runs, kills=len(kills),
        kills_before_cycle_started=sum(1 for _, started, _, _ in kills if not started),
        kills_mid_cycle=sum(1 for b, a in mid_cycle if b < a < owners_total),
        owners_done_before_and_after_each_kill=[(b, a) for _, _, b, a in kills],
        owners_total=owners_total, half_written_owners=half_written, **figures)
    assert len(kills) == DAYS * KILLS_PER_DAY
    # Each start-up kill landed before the cycle started.
    assert all(not started for moment, started, _, _ in kills if moment == "start-up"), kills
    # Each mid-cycle kill landed after the killed run committed owners and before the day was done.
    assert all(b < a < owners_total for b, a in mid_cycle), (mid_cycle, owners_total)
    assert days_forgotten == DAYS - 1
    assert_outbox_matches_contract()
