"""Crashes: SIGKILL the worker at seeded random moments of a cycle, restart it each time, then
one clean run. After every kill no owner is half-written; after the clean run the ledger and
the outbox are exactly what one uninterrupted run would have left."""

import random
import signal
from functools import partial

import pytest
from django.db import connection

from reminders.config import DEFAULT_THRESHOLDS
from tests.support import chaos_report
from tests.support.chaos import Worker, iso, load_spread_documents, outbox_count, wait_until
from tests.support.factories import Documents
from tests.support.invariants import check_invariants, check_owner_atomicity, check_structure, documents_md5
from tests.support.ledger import day
from tests.support.reference import ReferenceLedger, documents_from_database

KILLS = 21
DOCUMENTS = 6_000
SEED = 20261129


def forget_the_day() -> None:
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute("truncate document_expiry_reminders, outbox_messages,"
                       " document_expiry_reminder_runs")


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
    rng = random.Random(SEED)

    kills = runs = startup_kills = rounds = 0
    owners_done_at_kill: list[int] = []
    while kills < KILLS:
        runs += 1
        events_before = outbox_count()
        worker = Worker.start("--as-of", iso(as_of), REMINDER_BATCH_SIZE="5")
        if rng.random() < 0.25:
            # A bare random delay: lands in start-up, the census or the first batches.
            worker.wait(rng.uniform(0.05, 1.0))
        else:
            # After a random number of committed events, plus a random sliver: mid-batch.
            target = events_before + rng.randint(1, 20)
            wait_until(partial(progressed, worker, target), timeout=60,
                       what="the worker's progress", every=0.01)
            worker.wait(rng.uniform(0, 0.03))
        if worker.proc.poll() is None:
            startup_kills += not worker.logged("cycle started")
            worker.proc.send_signal(signal.SIGKILL)
            kills += 1
        code, _ = worker.finish()
        assert code in (0, -signal.SIGKILL), worker.lines[-5:]
        check_structure()
        counts = check_owner_atomicity(empty, done, docs)
        owners_done_at_kill.append(counts.get("done", 0))
        if code == 0 or kills == KILLS:
            # The day is done, or the kills are: one clean run, then the whole check.
            final = Worker.start("--as-of", iso(as_of))
            assert final.finish()[0] == 0, final.lines[-5:]
            check_invariants(documents_before=before, model=done)
            rounds += 1
            if kills < KILLS:
                forget_the_day()  # a fresh ledger and outbox: the same day again

    chaos_report.record(
        "crashes (SIGKILL)", documents=loaded, rounds=rounds, runs=runs + rounds, kills=kills,
        kills_before_cycle_started=startup_kills,
        owners_done_after_each_kill=owners_done_at_kill, owners_total=len(done.events),
        half_written_owners=0, lost=0, duplicated=0)
