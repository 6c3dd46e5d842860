"""OpenTelemetry traces of the cycle (docs/design.md, "Operations"): a span per cycle carrying
the run id as correlation id, a child span per batch, and the cycle's `traceparent` in every
outbox row's headers (from there the relay copies it into the Kafka headers). core.tracing
turns tracing on from the OTEL_* variables.
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from uuid import UUID

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer
from opentelemetry.util.types import Attributes

from reminders.config import ReminderSettings
from reminders.cycle import Cycle, CycleResult
from reminders.models import ReminderRun

TRACER_NAME = "pin_profile.reminders"
CYCLE_SPAN = "document_expiry_reminder.cycle"
BATCH_SPAN = "document_expiry_reminder.batch"


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
