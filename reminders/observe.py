"""Watching cycles from outside: their metrics, their traces and the health they report,
as observers passed into the cycle (`Cycle(observer=...)`); `ObservedCycles` runs cycles with
all three. The operations server of `--loop` around them is `reminders.serving`'s.

Traces (docs/design.md §5): a span per cycle carrying the run id as correlation id, a child
span per batch (from its claim's start to its counts, on either claim connection: with two,
consecutive batches' spans overlap), and the cycle's `traceparent` in every outbox row's
headers (from there the relay copies it into the Kafka headers). core.tracing turns tracing
on from OTEL_*.
"""

import threading
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer
from opentelemetry.util.types import Attributes

from core.gauges import DatabaseGauges
from reminders import metrics
from reminders.config import ReminderSettings
from reminders.cycle import Cycle
from reminders.health import LoopHealth
from reminders.models import SUCCESSFUL_STATUSES, ReminderRun
from reminders.result import BatchDone, CycleObserver, CycleResult, CycleStart

TRACER_NAME = "pin_profile.reminders"
CYCLE_SPAN = "document_expiry_reminder.cycle"
BATCH_SPAN = "document_expiry_reminder.batch"


class MetricsObserver(CycleObserver):
    """Counts each finished cycle, and has the database gauges read again after it."""

    def __init__(self, settings: ReminderSettings, gauges: tuple[DatabaseGauges, ...] = ()) -> None:
        self.gauges = gauges
        metrics.REMINDER_METRICS.install()
        metrics.declare_thresholds(settings.thresholds)

    def cycle_finished(self, result: CycleResult) -> None:
        if result.status == ReminderRun.Status.RUNNING:
            return  # an error escaped the cycle: nothing to count
        metrics.observe_cycle(result)
        for gauge in self.gauges:
            gauge.invalidate()  # the cycle changed the backlog: read it again at the next scrape


class HealthObserver(CycleObserver):
    """Reports cycles begun and ended to the loop's liveness (`/healthz`)."""

    def __init__(self, health: LoopHealth) -> None:
        self.health = health

    def cycle_started(self, cycle: CycleStart) -> Mapping[str, str]:
        self.health.cycle_started()
        return {}

    def cycle_finished(self, result: CycleResult) -> None:
        self.health.cycle_ended(
            succeeded=not result.dry_run and result.status in SUCCESSFUL_STATUSES)


class TracingObserver(CycleObserver):
    """A span per cycle, a child span per batch, and the trace context in the cycle's events."""

    def __init__(self, tracer: Tracer | None = None) -> None:
        self.tracer = tracer or trace.get_tracer(TRACER_NAME)
        self._span: Span | None = None
        self._run_id = ""
        self._scope = ExitStack()

    def cycle_started(self, cycle: CycleStart) -> Mapping[str, str]:
        self._run_id = str(cycle.run_id)
        attributes: Attributes = {
            "correlation_id": self._run_id,
            "reminders.run_id": self._run_id,
            "reminders.as_of": cycle.as_of.isoformat(),
            "reminders.batch_size": cycle.batch_size,
            "reminders.thresholds": list(cycle.thresholds),
            "reminders.dry_run": cycle.dry_run,
        }
        self._span = self._scope.enter_context(
            self.tracer.start_as_current_span(CYCLE_SPAN, attributes=attributes))
        carrier: dict[str, str] = {}
        propagate.inject(carrier)  # nothing when tracing is off: no traceparent header
        return carrier

    def batch_done(self, batch: BatchDone) -> None:
        # A child of the cycle's span, never of another batch's: batches on the two claim
        # connections overlap (docs/design.md §5). Counts only, no owner ids: the logs'
        # `reminder queued` lines already name them.
        counts = batch.counts
        attributes: Attributes = {
            "correlation_id": self._run_id,
            "reminders.batch.owners": batch.owners,
            "reminders.batch.lane": batch.connection,  # the claim connection, by this name
            "reminders.batch.documents": counts.documents,
            "reminders.batch.reminders_sent": counts.reminders_sent,
            "reminders.batch.owners_notified": counts.owners_notified,
            "reminders.batch.failed_owners": counts.failed_owners,
        }
        parent = trace.set_span_in_context(self._span) if self._span is not None else None
        self.tracer.start_span(BATCH_SPAN, context=parent, attributes=attributes,
                               start_time=batch.started_ns or None).end()

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
    if result.failure is not None:  # the cycle failed (CycleResult.fail)
        span.set_status(Status(StatusCode.ERROR, result.failure.reason))


class Observers(CycleObserver):
    """Several observers as one: started in order, finished in reverse order."""

    def __init__(self, *observers: CycleObserver) -> None:
        self.observers = observers

    def cycle_started(self, cycle: CycleStart) -> Mapping[str, str]:
        headers: dict[str, str] = {}
        for observer in self.observers:
            headers.update(observer.cycle_started(cycle))
        return headers

    def batch_done(self, batch: BatchDone) -> None:
        for observer in self.observers:
            observer.batch_done(batch)

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
