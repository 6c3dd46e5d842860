"""Crashes: SIGKILL the worker at seeded random moments of a cycle, restart it each time, then
let a run finish the day; the same day three times over, the ledger and the outbox emptied in
between. After every kill no owner is half-written; after each finished day the ledger and
the outbox are exactly what one uninterrupted run would have left.

Every moment is exercised each time: a kill in start-up (before the cycle starts), one right
after the cycle started (the census, the first batches), and kills mid-cycle, each after the
killed run committed owners of its own and before the day was done."""

import random
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
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
from tests.support.reference import RefDocument, ReferenceLedger, documents_from_database

DAYS = 3  # rounds of the same as-of day
KILLS_PER_DAY = 7  # one in start-up, one as the cycle starts, five mid-cycle
DOCUMENTS = 3_000  # about 950 owners a day: three whole days stay cheap
SEED = 20261129


def progressed(worker: Worker, events: int) -> bool:
    return outbox_count() >= events or worker.proc.poll() is not None


@dataclass
class TheDay:
    """The as-of day every run reminds for, and the model of what one uninterrupted run leaves."""

    as_of: datetime
    loaded: int  # documents
    before: str  # person_documents' digest, which no run may change
    docs: list[RefDocument]
    empty: ReferenceLedger
    done: ReferenceLedger
    owners_total: int  # the owners one run reminds


@dataclass
class Chaos:
    """What the runs and the kills did, over the days."""

    # (moment, whether the cycle had started, owners done before the run, and after the kill)
    kills: list[tuple[str, bool, int, int]] = field(default_factory=list)
    runs: int = 0
    days_forgotten: int = 0
    half_written: int = 0
    figures: dict[str, int] = field(
        default_factory=lambda: {"lost": 0, "duplicated": 0, "unexpected": 0})


@pytest.mark.slow
def test_sigkill_at_random_moments_leaves_no_half_written_owner(documents: Documents) -> None:
    the_day = load_the_day_and_model_it()
    rng = random.Random(SEED)
    chaos = Chaos()
    for today in range(DAYS):
        kill_the_worker_at_random_moments_of_the_day(the_day, rng, chaos)
        finish_the_day_and_check_it_is_the_models(the_day, chaos)
        if today < DAYS - 1:
            forget_written()  # a fresh ledger and outbox: the same day again
            chaos.days_forgotten += 1
    record_and_check_where_the_kills_landed(the_day, chaos)
    assert_outbox_matches_contract()


def load_the_day_and_model_it() -> TheDay:
    as_of = day(-3)
    loaded = load_spread_documents(DOCUMENTS, around=as_of, seed=SEED)
    before = documents_md5()
    docs = documents_from_database()
    empty = ReferenceLedger()
    done = empty.copy()
    done.run(docs, as_of, DEFAULT_THRESHOLDS)
    return TheDay(as_of, loaded, before, docs, empty, done, owners_total=len(done.events))


def kill_the_worker_at_random_moments_of_the_day(the_day: TheDay, rng: random.Random,
                                                 chaos: Chaos) -> None:
    """KILLS_PER_DAY runs, each SIGKILLed at its moment, in a shuffled order."""
    moments = ["start-up", "cycle start"] + ["mid-cycle"] * (KILLS_PER_DAY - 2)
    rng.shuffle(moments)
    # Where the mid-cycle kills land, as shares of the day's owners, in the order they run.
    shares = iter(sorted(rng.uniform(0.02, 0.85) for _ in range(KILLS_PER_DAY - 2)))
    owners_done = 0
    for moment in moments:
        chaos.runs += 1
        worker = Worker.start("--as-of", iso(the_day.as_of), REMINDER_BATCH_SIZE="5")
        wait_for_the_moment(worker, moment, rng, shares, the_day.owners_total)
        owners_done = kill_and_check_no_owner_is_half_written(worker, moment, the_day, chaos,
                                                              owners_done)


def wait_for_the_moment(worker: Worker, moment: str, rng: random.Random,
                        shares: Iterator[float], owners_total: int) -> None:
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


def kill_and_check_no_owner_is_half_written(worker: Worker, moment: str, the_day: TheDay,
                                            chaos: Chaos, owners_done: int) -> int:
    """SIGKILL the run, check the ledger's structure and every owner's atomicity; the owners
    done after the kill."""
    assert worker.proc.poll() is None, f"the run ended before its {moment} kill"
    started = bool(worker.logged("cycle started"))
    worker.proc.send_signal(signal.SIGKILL)
    code, _ = worker.finish()
    assert code == -signal.SIGKILL, worker.lines[-5:]
    check_structure()
    counts = check_owner_atomicity(the_day.empty, the_day.done, the_day.docs)
    chaos.half_written += counts["half_written"]
    chaos.kills.append((moment, started, owners_done, counts["done"]))
    return counts["done"]


def finish_the_day_and_check_it_is_the_models(the_day: TheDay, chaos: Chaos) -> None:
    """A run left alone finishes the day; the ledger and the outbox are then the model's."""
    final = Worker.start("--as-of", iso(the_day.as_of))
    chaos.runs += 1
    assert final.finish()[0] == 0, final.lines[-5:]
    snap = snapshot()
    for name, value in tally(snap, the_day.done).items():
        chaos.figures[name] += value
    check_invariants(documents_before=the_day.before, model=the_day.done, snap=snap)


def record_and_check_where_the_kills_landed(the_day: TheDay, chaos: Chaos) -> None:
    kills, owners_total = chaos.kills, the_day.owners_total
    mid_cycle = [(b, a) for moment, _, b, a in kills if moment == "mid-cycle"]
    chaos_report.record(
        "crashes (SIGKILL)", documents=the_day.loaded, days=DAYS,
        days_forgotten=chaos.days_forgotten, runs=chaos.runs, kills=len(kills),
        kills_before_cycle_started=sum(1 for _, started, _, _ in kills if not started),
        kills_mid_cycle=sum(1 for b, a in mid_cycle if b < a < owners_total),
        owners_done_before_and_after_each_kill=[(b, a) for _, _, b, a in kills],
        owners_total=owners_total, half_written_owners=chaos.half_written, **chaos.figures)
    assert len(kills) == DAYS * KILLS_PER_DAY
    # Each start-up kill landed before the cycle started.
    assert all(not started for moment, started, _, _ in kills if moment == "start-up"), kills
    # Each mid-cycle kill landed after the killed run committed owners and before the day was done.
    assert all(b < a < owners_total for b, a in mid_cycle), (mid_cycle, owners_total)
    assert chaos.days_forgotten == DAYS - 1
