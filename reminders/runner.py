"""A cycle with everything around it: its span, its metrics, the health it reports, and the
run-history prune after it. The commands run cycles through `ObservedCycles`."""

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from outbox.metrics import register_outbox_gauges
from reminders import metrics, store
from reminders.config import ReminderSettings
from reminders.cycle import CycleResult, DatabaseErrors, delete_in_chunks
from reminders.health import LoopHealth, database_ready
from reminders.logs import log_event
from reminders.ops_server import Probes, ops_server_from_env
from reminders.scrape import DatabaseGauges
from reminders.tracing import TracedCycle

logger = logging.getLogger("reminders.runner")

RUN_HISTORY_CHUNK = 1_000


def prune_run_history(using: str, cutoff: datetime, *, chunk: int = RUN_HISTORY_CHUNK) -> int:
    """Delete runs that started before `cutoff`, in bounded chunks, one transaction each."""
    total = delete_in_chunks(
        using, lambda size: store.prune_run_history(using, cutoff, size), chunk=chunk
    )
    log_event(logger, logging.INFO, "run history pruned", cutoff=cutoff, pruned=total)
    return total


def run_history_cutoff(now: datetime, settings: ReminderSettings) -> datetime:
    return now - timedelta(days=settings.run_history_days)


class ObservedCycles:
    """Callable: run one traced cycle, count it, report it to the health state, then prune
    the run history. Keyword arguments go to the cycle (as_of, dry_run, progress, ...)."""

    def __init__(
        self,
        settings: ReminderSettings,
        *,
        stop: threading.Event,
        using: str = "default",
        health: LoopHealth | None = None,
        gauges: tuple[DatabaseGauges, ...] = (),
    ) -> None:
        self.settings = settings
        self.stop = stop
        self.using = using
        self.health = health
        self.gauges = gauges
        metrics.declare_thresholds(settings.thresholds)

    def __call__(self, **options: Any) -> CycleResult:
        if self.health:
            self.health.cycle_started()
        succeeded = False
        try:
            result = TracedCycle(self.settings, stop=self.stop, using=self.using, **options).run()
            succeeded = not result.dry_run and result.status in metrics.SUCCESSFUL
        finally:
            if self.health:
                self.health.cycle_ended(succeeded=succeeded)
        metrics.observe_cycle(result)
        for gauge in self.gauges:
            gauge.invalidate()  # the cycle changed the backlog: read it again at the next scrape
        if succeeded:
            self._prune_history()
        return result

    def _prune_history(self) -> None:
        try:
            prune_run_history(self.using, run_history_cutoff(datetime.now(UTC), self.settings))
        except DatabaseErrors as exc:
            log_event(logger, logging.WARNING, "run history prune failed; retried next cycle",
                      error=type(exc).__name__)


@contextmanager
def observed_loop(
    settings: ReminderSettings, environ: Mapping[str, str], *, stop: threading.Event,
    using: str = "default",
) -> Iterator[ObservedCycles]:
    """The cycles of `--loop`, with the operations server of METRICS_ADDR around them (if set):
    /metrics (reminder metrics, the backlog and the outbox gauges), /healthz, /readyz."""
    health = LoopHealth(max_run_duration=settings.longest_cycle, max_silence=settings.max_silence)
    server = ops_server_from_env(
        environ, Probes(liveness=health.liveness, readiness=lambda: database_ready(using))
    )
    gauges: tuple[DatabaseGauges, ...] = ()
    if server is not None:
        gauges = _register_gauges(settings, using)
        try:
            health.seen_success(metrics.restore_last_success(using))
        except DatabaseErrors as exc:  # the loop's backoff deals with the database
            log_event(logger, logging.WARNING, "could not read the run history at start",
                      error=type(exc).__name__)
        server.start()
    try:
        yield ObservedCycles(settings, stop=stop, using=using, health=health, gauges=gauges)
    finally:
        if server is not None:
            server.stop()


_registered: dict[str, tuple[DatabaseGauges, ...]] = {}


def _register_gauges(settings: ReminderSettings, using: str) -> tuple[DatabaseGauges, ...]:
    # The registry is process-wide: register the database gauges once per process.
    if using not in _registered:
        _registered[using] = (
            metrics.register_backlog_gauge(settings, using=using),
            register_outbox_gauges(using=using),
        )
    return _registered[using]
