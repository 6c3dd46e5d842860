"""How a one-shot pass ends (publish_outbox without --loop): the line and the exit code
(core.exit_codes) when not everything went out, None when it exits 0. Pure: the pass's facts
in, the line out, as `CycleResult.failure_line()` is for a cycle; the command only reads the
facts and raises."""

from datetime import timedelta
from typing import NamedTuple

from core.exit_codes import ExitCode
from outbox.lanes import RelayStats
from outbox.store import Backlog, LockHolder

BACKLOG_RUNBOOK = "docs/runbooks/outbox-backlog.md"


class PassFailure(NamedTuple):
    """The one line a pass ends with, and its exit code."""

    line: str
    code: ExitCode


def failure_line(stats: RelayStats, backlog: Backlog, *, stopped: bool, stood_by_too_long: bool,
                 holder: LockHolder | None, delivery_timeout: timedelta) -> str | None:
    """`pass_failure`'s line alone."""
    failure = pass_failure(stats, backlog, stopped=stopped, stood_by_too_long=stood_by_too_long,
                           holder=holder, delivery_timeout=delivery_timeout)
    return None if failure is None else failure.line


def pass_failure(stats: RelayStats, backlog: Backlog, *, stopped: bool, stood_by_too_long: bool,
                 holder: LockHolder | None, delivery_timeout: timedelta) -> PassFailure | None:
    """The first of (FAILED unless said): rows released, failed, deferred or parked (a row
    whose topic is not on OUTBOX_TOPICS is parked without a failed delivery: REFUSED when
    nothing else went wrong, a person re-queues it); the stream held back past the bound; a
    pass that stood by while rows waited past its bound (`stood_by_too_long`, outbox.stood_by;
    `holder`: the session holding the relays' lock, if still held: REFUSED, a person ends that
    session); a broker that did not answer (UNAVAILABLE). None when none of these, or when the
    pass was stopped by a signal (the rest waits)."""
    if stopped:
        return None
    if stats.released or stats.failed or stats.deferred or stats.parked:
        again = bool(stats.released or stats.failed or stats.deferred)
        return PassFailure(
            f"not everything was delivered: {stats.released} released (broker unavailable), "
            f"{stats.failed} failed, {stats.parked} parked"
            + (f", {stats.deferred} deferred (a partition unavailable)" if stats.deferred
               else "")
            + ("; run again" if again
               else ": a parked message waits for an operator (manage.py requeue_outbox)"),
            ExitCode.FAILED if again else ExitCode.REFUSED)
    if stats.held_for_s:
        return PassFailure(
            f"{backlog.unpublished} message(s) still unpublished: the stream is held back by "
            f"a transaction open on the database server for {stats.held_for_s:.0f}s or more "
            f"({BACKLOG_RUNBOOK}, \"The stream is held back\"); run again", ExitCode.FAILED)
    if stood_by_too_long:
        return PassFailure(
            f"{backlog.unpublished} message(s) waiting, the oldest for "
            f"{backlog.oldest_age_s or 0:.0f}s, while another session holds the relays' "
            "lock and publishes none of them: "
            + (f"it is {holder}; if that is no working relay (a pooled server connection "
               "keeps a lock taken through a pooler by transaction), end it with "
               f"pg_terminate_backend({holder.pid})" if holder is not None
               else "it released the lock since")
            + f" ({BACKLOG_RUNBOOK}, \"Another session holds the relays' lock\"); run again",
            ExitCode.FAILED if holder is None else ExitCode.REFUSED)
    if not stats.broker_answered:
        return PassFailure("the broker did not answer within OUTBOX_DELIVERY_TIMEOUT "
                           f"({delivery_timeout.total_seconds():.0f}s): check "
                           "KAFKA_BOOTSTRAP_SERVERS and that Kafka is up; run again",
                           ExitCode.UNAVAILABLE)
    return None
