"""Watching cycles from outside: their metrics, their traces and the health they report,
as observers passed into the cycle (`Cycle(observer=...)`), and the operations server of
`--loop` around them.

Traces (docs/design.md §5): a span per cycle carrying the run id as correlation id, a child
span per batch, and the cycle's `traceparent` in every outbox row's headers (from there the
relay copies it into the Kafka headers). core.tracing turns tracing on from OTEL_*.
"""

import logging
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer
from opentelemetry.util.types import Attributes

from core import gauges as offered_gauges
from core.db import DatabaseErrors
from core.gauges import DatabaseGauges
from core.health import database_ready
from core.logs import log_event
from core.ops_server import Probes, ops_server_from_env
from reminders import metrics, store
from reminders.config import ReminderSettings
from reminders.cycle import Cycle
from reminders.health import LoopHealth
from reminders.models import SUCCESSFUL_STATUSES, ReminderRun
from reminders.result import CycleObserver, CycleResult

logger = logging.getLogger("reminders.observe")

TRACER_NAME = "pin_profile.reminders"
CYCLE_SPAN = "document_expiry_reminder.cycle"
BATCH_SPAN = "document_expiry_reminder.batch"


class MetricsObserver:
    """Counts each finished cycle, and has the database gauges read again after it."""

    def __init__(self, settings: ReminderSettings, gauges: tuple[DatabaseGauges, ...] = ()) -> None:
        self.gauges = gauges
        metrics.declare_thresholds(settings.thresholds)

    def cycle_started(self, cycle: Cycle) -> Mapping[str, str]:
        return {}

    def batch(self, cycle: Cycle, owner_ids: list[uuid.UUID]) -> AbstractContextManager[object]:
        return nullcontext()

    def cycle_finished(self, result: CycleResult) -> None:
        if result.status == ReminderRun.Status.RUNNING:
            return  # an error escaped the cycle: nothing to count
        metrics.observe_cycle(result)
        for gauge in self.gauges:
            gauge.invalidate()  # the cycle changed the backlog: read it again at the next scrape


class HealthObserver:
    """Reports cycles begun and ended to the loop's liveness (`/healthz`)."""

    def __init__(self, health: LoopHealth) -> None:
        self.health = health

    def cycle_started(self, cycle: Cycle) -> Mapping[str, str]:
        self.health.cycle_started()
        return {}

    def batch(self, cycle: Cycle, owner_ids: list[uuid.UUID]) -> AbstractContextManager[object]:
        return nullcontext()

    def cycle_finished(self, result: CycleResult) -> None:
        self.health.cycle_ended(
            succeeded=not result.dry_run and result.status in SUCCESSFUL_STATUSES)


class TracingObserver:
    """A span per cycle, a child span per batch, and the trace context in the cycle's events."""

    def __init__(self, tracer: Tracer | None = None) -> None:
        self.tracer = tracer or trace.get_tracer(TRACER_NAME)
        self._span: Span | None = None
        self._scope = ExitStack()

    def cycle_started(self, cycle: Cycle) -> Mapping[str, str]:
        run_id = str(cycle.result.run_id)
        attributes: Attributes = {
            "correlation_id": run_id,
            "reminders.run_id": run_id,
            "reminders.as_of": cycle.as_of.isoformat(),
            "reminders.batch_size": cycle.settings.batch_size,
            "reminders.thresholds": list(cycle.settings.thresholds),
            "reminders.dry_run": cycle.dry_run,
        }
        self._span = self._scope.enter_context(
            self.tracer.start_as_current_span(CYCLE_SPAN, attributes=attributes))
        carrier: dict[str, str] = {}
        propagate.inject(carrier)  # nothing when tracing is off: no traceparent header
        return carrier

    def batch(self, cycle: Cycle, owner_ids: list[uuid.UUID]) -> AbstractContextManager[object]:
        return self._batch_span(cycle, owner_ids)

    @contextmanager
    def _batch_span(self, cycle: Cycle, owner_ids: list[uuid.UUID]) -> Iterator[Span]:
        result = cycle.result
        documents, sent, notified, failed = (result.documents_processed, result.reminders_sent,
                                             result.owners_notified, result.failed_owners)
        # Counts only: a batch holds hundreds of owners, and their ids made every span heavy
        # (16 KB of OTLP at 410 owners) for what the logs' `reminder queued` lines already say.
        attributes: Attributes = {
            "correlation_id": str(result.run_id),
            "reminders.batch.owners": len(owner_ids),
        }
        with self.tracer.start_as_current_span(BATCH_SPAN, attributes=attributes) as span:
            yield span
            span.set_attributes({
                "reminders.batch.documents": result.documents_processed - documents,
                "reminders.batch.reminders_sent": result.reminders_sent - sent,
                "reminders.batch.owners_notified": result.owners_notified - notified,
                "reminders.batch.failed_owners": result.failed_owners - failed,
            })

    def cycle_finished(self, result: CycleResult) -> None:
        if self._span is not None:
            _describe_result(self._span, result)
        self._span = None
        self._scope.close()


def _describe_result(span: Span, result: CycleResult) -> None:
    span.set_attributes({
        "reminders.status": str(result.status),
        "reminders.due_documents": result.due_documents,
        "reminders.reminders_sent": result.reminders_sent,
        "reminders.owners_notified": result.owners_notified,
        "reminders.failed_owners": result.failed_owners,
        "reminders.pruned": result.pruned,
        "reminders.duration_ms": result.duration_ms,
    })
    if result.status == ReminderRun.Status.FAILED:
        span.set_status(Status(StatusCode.ERROR, result.error or "cycle failed"))


class Observers:
    """Several observers as one: started in order, finished in reverse order."""

    def __init__(self, *observers: CycleObserver) -> None:
        self.observers = observers

    def cycle_started(self, cycle: Cycle) -> Mapping[str, str]:
        headers: dict[str, str] = {}
        for observer in self.observers:
            headers.update(observer.cycle_started(cycle))
        return headers

    @contextmanager
    def _batches(self, cycle: Cycle, owner_ids: list[uuid.UUID]) -> Iterator[None]:
        with ExitStack() as stack:
            for observer in self.observers:
                stack.enter_context(observer.batch(cycle, owner_ids))
            yield

    def batch(self, cycle: Cycle, owner_ids: list[uuid.UUID]) -> AbstractContextManager[object]:
        return self._batches(cycle, owner_ids)

    def cycle_finished(self, result: CycleResult) -> None:
        for observer in reversed(self.observers):
            observer.cycle_finished(result)


class ObservedCycles:
    """Callable: run one cycle with its observers (health, trace, metrics). Keyword arguments
    go to the cycle (as_of, dry_run, progress, ...)."""

    def __init__(
        self,
        settings: ReminderSettings,
        *,
        stop: threading.Event,
        using: str = "default",
        health: LoopHealth | None = None,
        gauges: tuple[DatabaseGauges, ...] = (),
        tracer: Tracer | None = None,
    ) -> None:
        self.settings = settings
        self.stop = stop
        self.using = using
        self.health = health
        health_observers = (HealthObserver(health),) if health else ()
        self.observer = Observers(*health_observers, TracingObserver(tracer),
                                  MetricsObserver(settings, gauges))

    def __call__(self, **options: Any) -> CycleResult:
        return Cycle(self.settings, stop=self.stop, using=self.using, observer=self.observer,
                     **options).run()


@contextmanager
def observed_loop(
    settings: ReminderSettings, environ: Mapping[str, str], *, stop: threading.Event,
    using: str = "default",
) -> Iterator[ObservedCycles]:
    """The cycles of `--loop`, with the operations server of METRICS_ADDR around them (if set):
    /metrics (reminder metrics, the backlog and the gauges other apps offer), /healthz, /readyz."""
    health = LoopHealth(max_run_duration=settings.longest_cycle, max_silence=settings.max_silence)
    server = ops_server_from_env(
        environ, Probes(liveness=health.liveness, readiness=lambda: database_ready(using))
    )
    gauges: tuple[DatabaseGauges, ...] = ()
    if server is not None:
        gauges = _register_gauges(settings, using)
        try:
            seed_from_history(health, using)
        except DatabaseErrors as exc:  # the loop's backoff deals with the database
            log_event(logger, logging.WARNING, "could not read the run history at start",
                      error=type(exc).__name__)
        server.start()
    try:
        yield ObservedCycles(settings, stop=stop, using=using, health=health, gauges=gauges)
    finally:
        if server is not None:
            server.stop()


def seed_from_history(health: LoopHealth, using: str = "default") -> None:
    """At start-up: the run history's last success, for `/healthz` and the last-success gauge,
    by its age on the database's clock (which stamped it), so that a restart resets neither."""
    since_success = store.run_history_ages(using).since_success
    health.seen_success(since_success)
    metrics.restore_last_success(since_success)


_registered: dict[str, DatabaseGauges] = {}


def _register_gauges(settings: ReminderSettings, using: str) -> tuple[DatabaseGauges, ...]:
    # The registry is process-wide: register the backlog gauge once per process. The outbox's
    # come through core.gauges (offered by the outbox app: visible while the relay is down).
    if using not in _registered:
        _registered[using] = metrics.register_backlog_gauge(settings, using=using)
    return (_registered[using], *offered_gauges.install(using))
