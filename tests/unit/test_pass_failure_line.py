"""The line a one-shot relay pass ends with, its exit code, and when it exits 0
(outbox.one_pass)."""

from datetime import timedelta

import pytest

from core.exit_codes import ExitCode
from outbox.lanes import RelayStats
from outbox.one_pass import pass_failure
from outbox.store import Backlog, LockHolder

WAITING = Backlog(unpublished=7, parked=0, oldest_created_at=None, oldest_age_s=412.0)
HOLDER = LockHolder(pid=4242, user="relay", client_addr="10.0.0.9", client_port=5433,
                    application_name="pgbouncer", state="idle", idle_for_s=900.0)
TIMEOUT = timedelta(seconds=30)


def _line(stats: RelayStats, *, stopped: bool = False, stood_by_too_long: bool = False,
          holder: LockHolder | None = None) -> str | None:
    failure = pass_failure(stats, WAITING, stopped=stopped, stood_by_too_long=stood_by_too_long,
                           holder=holder, delivery_timeout=TIMEOUT)
    return None if failure is None else failure.line


def test_a_pass_that_delivered_everything_has_no_failure_line() -> None:
    assert _line(RelayStats(published=12, batches=2)) is None


def test_undelivered_rows_are_counted_and_deferred_ones_named_only_when_there_are_some() -> None:
    assert _line(RelayStats(released=3, failed=1, parked=2)) == (
        "not everything was delivered: 3 released (broker unavailable), 1 failed, 2 parked; "
        "run again")
    assert _line(RelayStats(deferred=4)) == (
        "not everything was delivered: 0 released (broker unavailable), 0 failed, 0 parked, "
        "4 deferred (a partition unavailable); run again")


def test_a_pass_that_only_parked_rows_exits_4_and_sends_the_operator_to_requeue() -> None:
    """A row whose topic is not on OUTBOX_TOPICS is parked without a failed delivery."""
    assert _line(RelayStats(published=5, parked=1)) == (
        "not everything was delivered: 0 released (broker unavailable), 0 failed, 1 parked: a "
        "parked message waits for an operator (manage.py requeue_outbox)")


def test_a_held_stream_says_how_many_wait_and_for_how_long() -> None:
    assert _line(RelayStats(held_for_s=61.4)) == (
        "7 message(s) still unpublished: the stream is held back by a transaction open on the "
        "database server for 61s or more (docs/runbooks/outbox-backlog.md, \"The stream is held "
        "back\"); run again")


def test_a_pass_that_stood_by_too_long_names_the_lock_holder_or_says_it_is_gone() -> None:
    named = _line(RelayStats(stood_by=True), stood_by_too_long=True, holder=HOLDER)
    assert named is not None
    assert named.startswith("7 message(s) waiting, the oldest for 412s, while another session "
                            f"holds the relays' lock and publishes none of them: it is {HOLDER};")
    assert "pg_terminate_backend(4242)" in named
    gone = _line(RelayStats(stood_by=True), stood_by_too_long=True, holder=None)
    assert gone is not None and "it released the lock since" in gone
    assert "pg_terminate_backend" not in gone


def test_a_broker_that_did_not_answer_names_the_delivery_timeout() -> None:
    assert _line(RelayStats(broker_answered=False)) == (
        "the broker did not answer within OUTBOX_DELIVERY_TIMEOUT (30s): check "
        "KAFKA_BOOTSTRAP_SERVERS and that Kafka is up; run again")


@pytest.mark.parametrize(("stats", "stood_by_too_long", "starts"), [
    (RelayStats(failed=1, held_for_s=70.0, broker_answered=False), True, "not everything"),
    (RelayStats(held_for_s=70.0, broker_answered=False), True, "7 message(s) still"),
    (RelayStats(stood_by=True, broker_answered=False), True, "7 message(s) waiting"),
])
def test_the_first_failure_in_order_is_the_one_said(
    stats: RelayStats, stood_by_too_long: bool, starts: str
) -> None:
    line = _line(stats, stood_by_too_long=stood_by_too_long, holder=HOLDER)
    assert line is not None and line.startswith(starts)


def test_a_pass_stopped_by_a_signal_exits_0_whatever_it_left() -> None:
    assert _line(RelayStats(released=5, held_for_s=9.0, broker_answered=False),
                 stopped=True, stood_by_too_long=True) is None


@pytest.mark.parametrize(("stats", "stood_by_too_long", "holder", "code"), [
    (RelayStats(released=1), False, None, ExitCode.FAILED),
    (RelayStats(deferred=1), False, None, ExitCode.FAILED),
    (RelayStats(published=5, parked=1), False, None, ExitCode.REFUSED),  # a person re-queues it
    (RelayStats(failed=1, parked=1), False, None, ExitCode.FAILED),
    (RelayStats(held_for_s=70.0), False, None, ExitCode.FAILED),
    (RelayStats(stood_by=True), True, HOLDER, ExitCode.REFUSED),  # a person ends that session
    (RelayStats(stood_by=True), True, None, ExitCode.FAILED),  # released since: run again
    (RelayStats(broker_answered=False), False, None, ExitCode.UNAVAILABLE),
    (RelayStats(failed=1, broker_answered=False), True, HOLDER, ExitCode.FAILED),
])
def test_each_failure_has_its_exit_code(
    stats: RelayStats, stood_by_too_long: bool, holder: LockHolder | None, code: ExitCode,
) -> None:
    failure = pass_failure(stats, WAITING, stopped=False, stood_by_too_long=stood_by_too_long,
                           holder=holder, delivery_timeout=TIMEOUT)
    assert failure is not None and failure.code is code
