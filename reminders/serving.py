"""The operations server of `--loop` around the worker's cycles (core.ops_server): /metrics
(reminder metrics, the backlog and the gauges other apps offer), /healthz (the loop's
liveness, `reminders.health`) and /readyz (the database answers)."""

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from core.db import DatabaseErrors
from core.gauges import DatabaseGauges
from core.health import database_ready
from core.logs import log_event
from core.ops_server import Probes, operations_server
from reminders import metrics, store
from reminders.config import ReminderSettings
from reminders.health import LoopHealth
from reminders.observe import ObservedCycles

logger = logging.getLogger("reminders.serving")


@contextmanager
def observed_loop(
    settings: ReminderSettings, environ: Mapping[str, str], *, stop: threading.Event,
    using: str = "default",
) -> Iterator[ObservedCycles]:
    """The cycles of `--loop`, with the operations server of METRICS_ADDR around them (if set)."""
    health = LoopHealth(max_run_duration=settings.longest_cycle, max_silence=settings.max_silence)

    def prepare() -> None:
        metrics.REMINDER_METRICS.install()
        _backlog_gauge(settings, using)
        try:
            seed_from_history(health, using)
        except DatabaseErrors as exc:  # the loop's backoff deals with the database
            log_event(logger, logging.WARNING, "could not read the run history at start",
                      error=type(exc).__name__)

    probes = Probes(liveness=health.liveness, readiness=lambda: database_ready(using))
    with operations_server(environ, probes, prepare=prepare, using=using) as offered:
        gauges = () if offered is None else (_backlog_gauge(settings, using), *offered)
        yield ObservedCycles(settings, stop=stop, using=using, health=health, gauges=gauges)


def seed_from_history(health: LoopHealth, using: str = "default") -> None:
    """At start-up: the run history's last success, for `/healthz` and the last-success gauge,
    by its age on the database's clock (which stamped it), so that a restart resets neither."""
    since_success = store.run_history_ages(using).since_success
    health.seen_success(since_success)
    metrics.restore_last_success(since_success)


_registered: dict[str, DatabaseGauges] = {}


def _backlog_gauge(settings: ReminderSettings, using: str) -> DatabaseGauges:
    # The registry is process-wide: the backlog gauge is registered once per process.
    if using not in _registered:
        _registered[using] = metrics.register_backlog_gauge(settings, using=using)
    return _registered[using]
