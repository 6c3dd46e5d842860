"""OpenTelemetry traces of the cycle (DESIGN 4): a span per cycle carrying the run id as
correlation id, a child span per batch, and the cycle's `traceparent` in every outbox row's
headers (from there the relay copies it into the Kafka headers).

Off by default. On when OTEL_TRACES_EXPORTER names an exporter (`otlp`, `console`) or an
OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
OTEL_SDK_DISABLED=true wins. The exporter and the batch processor read the other standard
OTEL_* variables themselves (endpoint, headers, timeouts, OTEL_SERVICE_NAME, ...).
"""

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from uuid import UUID

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, Status, StatusCode, Tracer
from opentelemetry.util.types import Attributes

from reminders.config import ConfigError, ReminderSettings
from reminders.cycle import Cycle, CycleResult
from reminders.models import ReminderRun

TRACER_NAME = "pin_profile.reminders"
DEFAULT_SERVICE_NAME = "pin-profile-reminders"
CYCLE_SPAN = "document_expiry_reminder.cycle"
BATCH_SPAN = "document_expiry_reminder.batch"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if raw:
        return [n.strip() for n in raw.split(",") if n.strip() and n.strip() != "none"]
    return ["otlp"] if any(environ.get(v) for v in _ENDPOINTS) else []


def _exporter(name: str) -> SpanExporter:
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if name == "console":
        return ConsoleSpanExporter()
    raise ConfigError("OTEL_TRACES_EXPORTER", f"supported exporters are otlp and console, got {name!r}")


def configure_tracing(environ: Mapping[str, str]) -> TracerProvider | None:
    """Install a global tracer provider when the environment asks for traces; else None."""
    names = _exporter_names(environ)
    if not names:
        return None
    exporters = [_exporter(name) for name in names]
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: DEFAULT_SERVICE_NAME}
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


class TracedCycle(Cycle):
    """A cycle inside a span, with a child span per batch and the trace context in its events."""

    def __init__(self, settings: ReminderSettings, *, tracer: Tracer | None = None,
                 **options: Any) -> None:
        super().__init__(settings, **options)
        self.tracer = tracer or trace.get_tracer(TRACER_NAME)

    def run(self) -> CycleResult:
        run_id = str(self.result.run_id)
        attributes: Attributes = {
            "correlation_id": run_id,
            "reminders.run_id": run_id,
            "reminders.as_of": self.as_of.isoformat(),
            "reminders.batch_size": self.settings.batch_size,
            "reminders.thresholds": list(self.settings.thresholds),
            "reminders.dry_run": self.dry_run,
        }
        with self.tracer.start_as_current_span(CYCLE_SPAN, attributes=attributes) as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)  # nothing when tracing is off: no traceparent header
            if carrier:
                self.extra_headers = {**(self.extra_headers or {}), **carrier}
            result = super().run()
            _describe_result(span, result)
            return result

    def batch_scope(self, owner_ids: list[UUID]) -> AbstractContextManager[object]:
        return self._batch_span(owner_ids)

    @contextmanager
    def _batch_span(self, owner_ids: list[UUID]) -> Iterator[Span]:
        result = self.result
        documents, sent, failed = (result.documents_processed, result.reminders_sent,
                                   result.failed_owners)
        attributes: Attributes = {
            "correlation_id": str(result.run_id),
            "reminders.batch.owners": len(owner_ids),
            "reminders.owner_user_ids": [str(o) for o in owner_ids],
        }
        with self.tracer.start_as_current_span(BATCH_SPAN, attributes=attributes) as span:
            yield span
            span.set_attributes({
                "reminders.batch.documents": result.documents_processed - documents,
                "reminders.batch.reminders_sent": result.reminders_sent - sent,
                "reminders.batch.failed_owners": result.failed_owners - failed,
            })


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
