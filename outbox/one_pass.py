"""One relay pass (manage.py publish_outbox without --loop), as one action the command calls:
the pass, the backlog after it, and how it ends (docs/outbox-relay.md, "One batch"): the line
and the exit code (core.exit_codes) when not everything went out, none when it exits 0. The
command only parses its options, calls `publish_one_pass` and raises the failure it returns.

The verdicts are pure (the pass's facts in, the verdict out), as `CycleResult.failure_line()`
is for a cycle: `stood_by_while_rows_waited` says whether a pass that stood by must fail
(another session holds the relays' lock, and rows have waited past a bound all the same, so
that session publishes nothing: a relay behind a pooler by transaction leaves its lock on a
pooled server connection that publishes nothing until the pooler closes it); `pass_failure`
says which failure the pass ends with."""

import contextlib
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

from core.exit_codes import ExitCode
from core.progress import ProgressBar
from outbox import store
from outbox.config import RelaySettings
from outbox.lanes import RelayStats
from outbox.relay import Relay
from outbox.store import Backlog, LockHolder

BACKLOG_RUNBOOK = "docs/runbooks/outbox-backlog.md"


class PassFailure(NamedTuple):
    """The one line a pass ends with, and its exit code."""

    line: str
    code: ExitCode


@dataclass(frozen=True, slots=True)
class PassOutcome:
    """What a pass did, what is left, and the failure it ends with (None: exit 0)."""

    stats: RelayStats
    backlog: Backlog
    failure: PassFailure | None


def publish_one_pass(settings: RelaySettings, *, stop: threading.Event, held_bound: timedelta,
                     stood_by_bound: timedelta, progress: ProgressBar | None = None,
                     using: str = "default") -> PassOutcome:
    """Run one pass (Relay.run_pass: rows held back by an open transaction waited for up to
    `held_bound`), then read the backlog; a pass that stood by while the oldest waiting row is
    `stood_by_bound` old names the session holding the relays' lock. `progress` (a bar on a
    terminal) is told the rows done after each batch."""
    relay = Relay(settings, using=using, stop=stop, on_batch=None if progress is None else
                  lambda stats: progress(stats.published + stats.released + stats.failed))
    try:
        with progress or contextlib.nullcontext():
            if progress is not None and progress.enabled:
                progress(0, store.backlog(using).unpublished)
            stats = relay.run_pass(held_bound.total_seconds())
        backlog = store.backlog(using)
        stood_by_too_long = stood_by_while_rows_waited(
            stood_by=stats.stood_by, oldest_waiting_s=backlog.oldest_age_s,
            bound_s=stood_by_bound.total_seconds())
        holder = store.relay_lock_holder(using) if stood_by_too_long else None
    finally:
        relay.close()
    failure = pass_failure(stats, backlog, stopped=stop.is_set(),
                           stood_by_too_long=stood_by_too_long, holder=holder,
                           delivery_timeout=settings.delivery_timeout)
    return PassOutcome(stats, backlog, failure)


def stood_by_while_rows_waited(*, stood_by: bool, oldest_waiting_s: float | None,
                               bound_s: float) -> bool:
    """True when the pass stood by and the oldest waiting row is at least `bound_s` old."""
    return stood_by and oldest_waiting_s is not None and oldest_waiting_s >= bound_s


def pass_failure(stats: RelayStats, backlog: Backlog, *, stopped: bool, stood_by_too_long: bool,
                 holder: LockHolder | None, delivery_timeout: timedelta) -> PassFailure | None:
    """The first of (FAILED unless said): rows released, failed, deferred or parked (a row
    whose topic is not on OUTBOX_TOPICS is parked without a failed delivery: REFUSED when
    nothing else went wrong, a person re-queues it); the stream held back past the bound; a
    pass that stood by while rows waited past its bound (`stood_by_too_long`,
    stood_by_while_rows_waited; `holder`: the session holding the relays' lock, if still held:
    REFUSED, a person ends that session); a broker that did not answer (UNAVAILABLE). None when
    none of these, or when the pass was stopped by a signal (the rest waits)."""
    if stopped:
        return None
    if stats.released or stats.failed or stats.deferred or stats.parked:
        return _not_delivered(stats)
    if stats.held_for_s:
        return PassFailure(
            f"{backlog.unpublished} message(s) still unpublished: the stream is held back by "
            f"a transaction open on the database server for {stats.held_for_s:.0f}s or more "
            f"({BACKLOG_RUNBOOK}, \"The stream is held back\"); run again", ExitCode.FAILED)
    if stood_by_too_long:
        return _stood_by(backlog, holder)
    if not stats.broker_answered:
        return PassFailure("the broker did not answer within OUTBOX_DELIVERY_TIMEOUT "
                           f"({delivery_timeout.total_seconds():.0f}s): check "
                           "KAFKA_BOOTSTRAP_SERVERS and that Kafka is up; run again",
                           ExitCode.UNAVAILABLE)
    return None


def _not_delivered(stats: RelayStats) -> PassFailure:
    """Rows released, failed, deferred (run again: FAILED) or only parked (REFUSED)."""
    again = bool(stats.released or stats.failed or stats.deferred)
    return PassFailure(
        f"not everything was delivered: {stats.released} released (broker unavailable), "
        f"{stats.failed} failed, {stats.parked} parked"
        + (f", {stats.deferred} deferred (a partition unavailable)" if stats.deferred else "")
        + ("; run again" if again
           else ": a parked message waits for an operator (manage.py requeue_outbox)"),
        ExitCode.FAILED if again else ExitCode.REFUSED)


def _stood_by(backlog: Backlog, holder: LockHolder | None) -> PassFailure:
    """Rows waited past the bound while another session held the relays' lock: REFUSED while
    it still holds it (named, with how to end it), FAILED once it let go."""
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
