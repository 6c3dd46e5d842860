"""Traces: a span per cycle with the run id as correlation id, a child span per batch, and the
cycle's traceparent in every outbox row; off by default, on with the OTEL_* variables."""

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from django.db import connection
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from core.tracing import _exporter_names, configure_tracing
from reminders.config import ReminderSettings
from reminders.cycle import Cycle
from reminders.observe import BATCH_SPAN, CYCLE_SPAN, TracingObserver
from tests.conftest import as_worker, command_env, manage_py
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, expiring_in


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


def _headers() -> list[dict[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute("select headers from outbox_messages order by created_at, id")
        return [json.loads(h) if isinstance(h, str) else h for (h,) in cursor.fetchall()]


def _traced_cycle(exporter: InMemorySpanExporter, **settings: Any) -> Any:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    cycle = Cycle(ReminderSettings().with_overrides(**settings), as_of=AS_OF,
                  observer=TracingObserver(tracer=provider.get_tracer("test")))
    with as_worker():
        return cycle.run()


def test_cycle_span_with_batch_children_and_traceparent_in_every_event(
    documents: Documents, exporter: InMemorySpanExporter
) -> None:
    for days in (0, 1, 7):
        documents(expires_at=expiring_in(days))

    result = _traced_cycle(exporter, batch_size=1)

    spans: tuple[ReadableSpan, ...] = exporter.get_finished_spans()
    [cycle] = [s for s in spans if s.name == CYCLE_SPAN]
    batches = [s for s in spans if s.name == BATCH_SPAN]
    assert cycle.attributes is not None and cycle.context is not None
    assert cycle.attributes["correlation_id"] == str(result.run_id)
    assert cycle.attributes["reminders.batch_size"] == 1
    assert cycle.attributes["reminders.reminders_sent"] == 3
    assert len(batches) == 3
    assert all(b.parent is not None and b.parent.span_id == cycle.context.span_id for b in batches)
    assert [dict(b.attributes or {})["reminders.batch.owners"] for b in batches] == [1, 1, 1]
    assert [dict(b.attributes or {})["reminders.batch.documents"] for b in batches] == [1, 1, 1]
    assert not [k for b in batches for k in (b.attributes or {}) if "owner_user_id" in k]
    traceparent = (f"00-{cycle.context.trace_id:032x}-{cycle.context.span_id:016x}"
                   f"-{cycle.context.trace_flags:02x}")
    headers = _headers()
    assert len(headers) == 3
    assert {h["traceparent"] for h in headers} == {traceparent}
    assert {h["correlation_id"] for h in headers} == {str(result.run_id)}


def test_without_a_tracer_provider_no_traceparent_is_written(documents: Documents) -> None:
    documents(expires_at=expiring_in(7))
    with as_worker():
        Cycle(ReminderSettings(), as_of=AS_OF, observer=TracingObserver()).run()  # the global, no-op provider
    [headers] = _headers()
    assert "traceparent" not in headers


@pytest.mark.parametrize(("environ", "exporters"), [
    ({}, []),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, []),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, []),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "console"]),
])
def test_tracing_is_off_unless_the_environment_asks(
    environ: dict[str, str], exporters: list[str]
) -> None:
    assert _exporter_names(environ) == exporters


def test_tracing_off_configures_nothing() -> None:
    assert configure_tracing({}) is None


class _Collector(BaseHTTPRequestHandler):
    received: list[ExportTraceServiceRequest] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        type(self).received.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_the_command_exports_spans_over_otlp(documents: Documents) -> None:
    documents(expires_at=expiring_in(7))
    collector = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        done = subprocess.run(
            [*manage_py(), "run_expiry_reminders", "--as-of", AS_OF.isoformat()],  # the data's day
            capture_output=True, text=True, timeout=120,
            check=False, env=command_env(
                OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_address[1]}",
                OTEL_SERVICE_NAME="reminders-under-test"),
        )
    finally:
        collector.shutdown()
        collector.server_close()
    assert done.returncode == 0, done.stderr
    spans = [(span, resource) for request in _Collector.received
             for resource in request.resource_spans
             for scope in resource.scope_spans for span in scope.spans]
    [(cycle, resource)] = [(s, r) for s, r in spans if s.name == CYCLE_SPAN]
    service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
    [headers] = _headers()
    assert service == "reminders-under-test"
    version, trace_id, span_id, _flags = headers["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", cycle.trace_id.hex(), cycle.span_id.hex())
    assert {a.key: a.value.string_value for a in cycle.attributes}["correlation_id"] == \
        headers["correlation_id"]
