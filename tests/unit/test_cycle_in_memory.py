"""The cycle over a ledger in memory (tests/support/memory_ledger.py), no database: the stop,
the deadline, the owner-by-owner retry, the pairing across two claim connections and a lost
connection, on one connection and on two. tests/integration/test_cycle.py and
test_claim_lanes.py hold the same on PostgreSQL."""

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from reminders.config import ReminderSettings
from reminders.cycle import Cycle
from reminders.models import ReminderRun
from reminders.result import BatchDone, CycleObserver, CycleResult
from tests.support.ledger import AS_OF
from tests.support.memory_ledger import MemoryConnections, MemoryLedger, memory

Status = ReminderRun.Status
MAIN = threading.main_thread().name


class Told(CycleObserver):
    """The batches the observer is told of, in order."""

    def __init__(self) -> None:
        self.batches: list[BatchDone] = []

    def batch_done(self, batch: BatchDone) -> None:
        self.batches.append(batch)


def _cycle(ledger: MemoryLedger, connections: MemoryConnections, *, claim_connections: int,
           batch_size: int = 1, **options: Any) -> Cycle:
    settings = ReminderSettings().with_overrides(
        batch_size=batch_size, claim_connections=claim_connections,
        max_run_duration=timedelta(seconds=60))
    return Cycle(settings, as_of=AS_OF, ledger=ledger, connections=connections, **options)


def _after_batches(count: int, then: Callable[[], None]) -> Callable[[int, int], None]:
    """A progress callback that calls `then` once `count` batches are counted."""
    counted = [0]

    def progress(_done: int, _total: int) -> None:
        counted[0] += 1
        if counted[0] == count:
            then()

    return progress


@pytest.mark.parametrize("claim_connections", [1, 2])
def test_every_due_owner_is_claimed_once_and_counted(claim_connections: int) -> None:
    ledger, connections = memory(1, 2, 1, 3, 1)
    seen: list[tuple[int, int]] = []

    result = _cycle(ledger, connections, claim_connections=claim_connections, batch_size=2,
                    progress=lambda done, total: seen.append((done, total))).run()

    assert (result.status, result.failed_owners) == (Status.SUCCEEDED, 0)
    assert sorted(ledger.claimed_owners()) == sorted(o.owner_user_id for o in ledger.due)
    assert (result.owners_notified, result.reminders_sent, result.due_documents) == (5, 8, 8)
    assert seen[-1] == (8, 8) and len(seen) == 5  # whole owners: none fits beside another
    assert ledger.started and ledger.prunes == 1 and ledger.finished is result


@pytest.mark.parametrize("claim_connections", [1, 2])
def test_a_stop_mid_cycle_starts_no_other_batch_and_leaves_the_prune(
    claim_connections: int,
) -> None:
    ledger, connections = memory(1, 1, 1, 1, 1, 1)
    stop = threading.Event()

    result = _cycle(ledger, connections, claim_connections=claim_connections, stop=stop,
                    progress=_after_batches(1, stop.set)).run()

    # on two, the batch sent to the second connection was in flight: it commits and counts
    assert (result.status, result.owners_notified) == (Status.STOPPED, claim_connections)
    assert len(ledger.claims) == claim_connections
    assert ledger.prunes == 0


@pytest.mark.parametrize("claim_connections", [1, 2])
def test_the_deadline_starts_no_other_batch_and_the_prune_still_runs(
    claim_connections: int,
) -> None:
    ledger, connections = memory(1, 1, 1, 1, 1, 1)
    now = [0.0]

    def past_the_deadline() -> None:
        now[0] = 61.0

    result = _cycle(ledger, connections, claim_connections=claim_connections,
                    clock=lambda: now[0], progress=_after_batches(1, past_the_deadline)).run()

    assert (result.status, result.owners_notified) == (Status.TIMED_OUT, claim_connections)
    assert ledger.prunes == 1  # a ledger whose every cycle times out stays bounded


@pytest.mark.parametrize(("claim_connections", "failing"), [(1, 1), (2, 1), (2, 4)])
def test_a_failing_owner_is_retried_alone_on_the_cycles_thread_and_the_others_are_done(
    claim_connections: int, failing: int, caplog: pytest.LogCaptureFixture,
) -> None:
    # batches of three owners: on two connections the first goes to the second connection
    ledger, connections = memory(1, 1, 1, 1, 1, 1, failing=[failing])
    bad = ledger.due[failing].owner_user_id

    result = _cycle(ledger, connections, claim_connections=claim_connections,
                    batch_size=3).run()

    assert (result.status, result.failed_owners, result.owners_notified) == (
        Status.PARTIAL, 1, 5)
    assert bad not in ledger.claimed_owners() and len(ledger.claimed_owners()) == 5
    retries = [made for made in ledger.claims if len(made.owners) == 1]
    assert len(retries) == 3 and {made.thread for made in retries} == {MAIN}
    assert [made.committed for made in retries].count(False) == 1
    assert caplog.messages.count("batch failed, retrying owner by owner") == 1
    assert result.owner_failure is not None and "RaiseException" in result.owner_failure.reason


def test_on_two_connections_batches_go_in_pairs_each_settled_on_the_cycles_thread() -> None:
    ledger, connections = memory(1, 1, 1, 1, 1)
    told = Told()
    settled_on: list[str] = []

    result = _cycle(ledger, connections, claim_connections=2, observer=told,
                    progress=lambda _d, _t: settled_on.append(
                        threading.current_thread().name)).run()

    assert result.status == Status.SUCCEEDED and result.owners_notified == 5
    owners = [o.owner_user_id for o in ledger.due]
    second = connections.seconds[0]
    on_second = [made.owners[0] for made in ledger.claims if made.thread != MAIN]
    assert on_second == [owners[0], owners[2], owners[4]]  # the 1st of each pair, and the last
    assert second.connected_in == second.closed_in != MAIN
    assert {made.thread for made in ledger.claims} == {MAIN, second.connected_in}
    # the one claimed here is settled first, then the one sent meanwhile
    assert [batch.connection for batch in told.batches] == [0, 1, 0, 1, 1]
    assert settled_on == [MAIN] * 5
    sent, here = told.batches[1], told.batches[0]
    assert 0 < sent.started_ns <= here.started_ns  # sent before the other was claimed


def test_without_a_second_connection_the_cycle_claims_on_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger, connections = memory(1, 1, 1, second_available=False)

    result = _cycle(ledger, connections, claim_connections=2).run()

    assert (result.status, result.owners_notified) == (Status.SUCCEEDED, 3)
    assert {made.thread for made in ledger.claims} == {MAIN}
    assert "second claim connection unavailable, claiming on one" in caplog.messages


def _failed_on_a_lost_connection(result: CycleResult, ledger: MemoryLedger) -> None:
    assert result.status == Status.FAILED and ledger.finished is result
    assert result.failure is not None and "database unreachable" in result.failure.reason
    assert ledger.prunes == 0


@pytest.mark.parametrize("lost", ["second", "cycle"])
def test_a_lost_connection_fails_the_cycle_once_the_batch_in_flight_is_settled(
    lost: str,
) -> None:
    # batches of one: the 1st to the second connection, the 2nd claimed on the cycle's
    ledger, connections = memory(1, 1, 1, 1, losing=[0 if lost == "second" else 1])

    result = _cycle(ledger, connections, claim_connections=2).run()

    _failed_on_a_lost_connection(result, ledger)
    assert (result.failed_owners, result.owners_notified) == (1, 1)  # the other committed
    assert len(ledger.claims) == 2  # no batch after, no retry of the lost one
    assert connections.read[0].fetched == 3  # nor a read of them (one owner read ahead)
    assert connections.seconds[0].closed_in is not None
    assert (connections.cycle.lost, connections.seconds[0].lost) == (
        lost == "cycle", lost == "second")


def test_a_lost_connection_on_one_connection_fails_the_cycle_at_once() -> None:
    ledger, connections = memory(1, 1, 1, 1, losing=[2])

    result = _cycle(ledger, connections, claim_connections=1, batch_size=2).run()

    _failed_on_a_lost_connection(result, ledger)
    assert (result.failed_owners, result.owners_notified) == (2, 2)  # the batch of two
    assert [made.committed for made in ledger.claims] == [True, False]


def test_a_connection_lost_in_the_retry_ends_it_and_the_cycle() -> None:
    # the batch fails for its 1st owner (its error first); retried alone, the 2nd loses the
    # session
    ledger, connections = memory(1, 1, 1, 1, 1, failing=[0], losing=[1])

    result = _cycle(ledger, connections, claim_connections=1, batch_size=3).run()

    _failed_on_a_lost_connection(result, ledger)
    assert result.failed_owners == 2 and result.owners_notified == 0
    assert [len(made.owners) for made in ledger.claims] == [3, 1, 1]  # the 3rd never retried
