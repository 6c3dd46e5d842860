"""Traces: a span per cycle with the run id as correlation id, a child span per batch (counts,
no owner ids), and the cycle's traceparent in every outbox row; off by default, on with the
standard OTEL_* variables, exported over OTLP by gRPC or HTTP to a real receiver.
tests/unit/test_tracing_config.py checks the variables' values."""

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import grpc
import pytest
from django.db import connection
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from typing_extensions import override

from core.tracing import configure_tracing
from reminders.config import ReminderSettings
from reminders.cycle import Cycle
from reminders.observe import BATCH_SPAN, CYCLE_SPAN, TracingObserver
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import as_worker
from tests.support.factories import Documents
from tests.support.ledger import AS_OF, expiring_in, outbox_refusing
from tests.support.processes import command_env, manage_py


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
    assert_outbox_matches_contract()


def test_a_batch_span_counts_the_owner_that_failed_in_it(
    documents: Documents, exporter: InMemorySpanExporter
) -> None:
    good = [documents(expires_at=expiring_in(d)) for d in (2, 3)]
    bad = documents(expires_at=expiring_in(3))
    with outbox_refusing(bad.owner_user_id):  # a real failure, for one owner only
        result = _traced_cycle(exporter, batch_size=100)

    [batch] = [s for s in exporter.get_finished_spans() if s.name == BATCH_SPAN]
    attributes = dict(batch.attributes or {})
    assert result.failed_owners == 1
    assert attributes["reminders.batch.owners"] == 3
    assert attributes["reminders.batch.failed_owners"] == 1
    assert attributes["reminders.batch.owners_notified"] == len(good)
    assert attributes["reminders.batch.reminders_sent"] == len(good)
    assert_outbox_matches_contract()


def test_batches_on_two_connections_overlap_as_siblings_each_with_its_own_counts(
    documents: Documents, exporter: InMemorySpanExporter
) -> None:
    docs = [documents(expires_at=expiring_in(d)) for d in (1, 2, 3, 4, 5)]
    bad = docs[2]  # the 3rd batch, sent to the second connection
    with outbox_refusing(bad.owner_user_id):
        result = _traced_cycle(exporter, batch_size=1, claim_connections=2)

    spans = exporter.get_finished_spans()
    [cycle] = [s for s in spans if s.name == CYCLE_SPAN]
    batches = sorted((s for s in spans if s.name == BATCH_SPAN), key=lambda s: s.start_time or 0)
    assert cycle.context is not None and result.failed_owners == 1
    assert all(b.parent is not None and b.parent.span_id == cycle.context.span_id for b in batches)
    attributes = [dict(b.attributes or {}) for b in batches]
    assert [a["reminders.batch.lane"] for a in attributes] == [1, 0, 1, 0, 1]
    assert [a["reminders.batch.failed_owners"] for a in attributes] == [0, 0, 1, 0, 0]
    assert [a["reminders.batch.owners_notified"] for a in attributes] == [1, 1, 0, 1, 1]
    assert [a["reminders.batch.documents"] for a in attributes] == [1, 1, 0, 1, 1]
    for lane, here in ((batches[0], batches[1]), (batches[2], batches[3])):
        # the second connection's batch is in flight around the one claimed meanwhile
        assert lane.start_time is not None and here.start_time is not None
        assert lane.end_time is not None and here.end_time is not None
        assert lane.start_time <= here.start_time and here.end_time <= lane.end_time
    assert_outbox_matches_contract()


def test_without_a_tracer_provider_no_traceparent_is_written(documents: Documents) -> None:
    documents(expires_at=expiring_in(7))
    with as_worker():
        Cycle(ReminderSettings(), as_of=AS_OF, observer=TracingObserver()).run()  # the global, no-op provider
    [headers] = _headers()
    assert "traceparent" not in headers
    assert_outbox_matches_contract()



def test_tracing_off_configures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    assert configure_tracing() is None


@dataclass
class _Received:
    """What a receiver got: the export requests and, for each, its headers (metadata)."""

    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    refuse: bool = False  # answer as a collector that refuses the credentials


class _HttpCollector(BaseHTTPRequestHandler):
    server: "_HttpReceiver"

    def do_POST(self) -> None:
        assert self.path == "/v1/traces"
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.received.headers.append({k.lower(): v for k, v in self.headers.items()})
        self.server.received.requests.append(request)
        self.send_response(401 if self.server.received.refuse else 200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _HttpReceiver(HTTPServer):
    def __init__(self, received: _Received) -> None:
        super().__init__(("127.0.0.1", 0), _HttpCollector)
        self.received = received


class _GrpcCollector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: _Received) -> None:
        self.received = received

    @override
    def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:
        self.received.headers.append(dict(context.invocation_metadata()))
        self.received.requests.append(request)
        if self.received.refuse:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "credentials refused")
        return ExportTraceServiceResponse()


@contextmanager
def _http_receiver(refuse: bool = False) -> Iterator[tuple[str, _Received]]:
    server = _HttpReceiver(_Received(refuse=refuse))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.received
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _grpc_receiver(refuse: bool = False) -> Iterator[tuple[str, _Received]]:
    received = _Received(refuse=refuse)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_GrpcCollector(received), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(grace=None)


def _otel_free_env(**otel: str) -> dict[str, str]:
    env = {k: v for k, v in command_env().items() if not k.startswith("OTEL_")}
    return {**env, **otel}


def _value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(span: Span) -> dict[str, object]:
    return {a.key: _value(a.value) for a in span.attributes}


SECRET = "Bearer s3cret-t0ken"  # noqa: S105 (a made-up credential, to find in no output)


@pytest.mark.parametrize(("protocol", "receiver"), [
    ("grpc", _grpc_receiver),
    ("http/protobuf", _http_receiver),
    (None, _http_receiver),  # the default: http/protobuf, the specification's
], ids=["grpc", "http-protobuf", "default-http"])
def test_the_command_exports_spans_over_otlp(
    documents: Documents, protocol: str | None, receiver: Any
) -> None:
    owners = {str(documents(expires_at=expiring_in(7)).owner_user_id) for _ in range(3)}
    protocol_env = {"OTEL_EXPORTER_OTLP_PROTOCOL": protocol} if protocol else {}
    with receiver() as (endpoint, received):
        done = _run_the_command_exporting_to(endpoint, protocol_env)
    assert done.returncode == 0, done.stderr
    _check_the_credentials_went_to_the_receiver_only(done, received)
    spans = _spans(received)
    cycle = _check_the_cycle_span_and_its_resource(spans)
    _check_the_batch_span_names_no_owner(spans, cycle, owners)
    assert_outbox_matches_contract()


def _run_the_command_exporting_to(endpoint: str,
                                  protocol_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*manage_py(), "run_expiry_reminders", "--as-of", AS_OF.isoformat()],  # the data's day
        capture_output=True, text=True, timeout=120, check=False,
        env=_otel_free_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, **protocol_env,
            OTEL_EXPORTER_OTLP_HEADERS=f"authorization={SECRET}",
            OTEL_SERVICE_NAME="reminders-under-test",
            OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test"),
    )


def _check_the_credentials_went_to_the_receiver_only(
    done: subprocess.CompletedProcess[str], received: _Received
) -> None:
    assert SECRET not in done.stdout + done.stderr and "s3cret" not in done.stderr
    assert received.requests, "the receiver got no spans"
    assert {h.get("authorization") for h in received.headers} == {SECRET}


def _spans(received: _Received) -> list[tuple[Span, ResourceSpans]]:
    """Every span received, with the resource it was sent under."""
    return [(span, resource) for request in received.requests
            for resource in request.resource_spans
            for scope in resource.scope_spans for span in scope.spans]


def _check_the_cycle_span_and_its_resource(spans: list[tuple[Span, ResourceSpans]]) -> Span:
    """One cycle span, under the configured resource, its trace and run id in every outbox row;
    the cycle span."""
    [(cycle, resource)] = [(s, r) for s, r in spans if s.name == CYCLE_SPAN]
    resource_attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert resource_attributes["service.name"] == "reminders-under-test"
    assert resource_attributes["deployment.environment"] == "test"
    rows = _headers()
    [traceparent] = {h["traceparent"] for h in rows}
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert (version, trace_id, span_id) == ("00", cycle.trace_id.hex(), cycle.span_id.hex())
    assert {_attributes(cycle)["correlation_id"]} == {h["correlation_id"] for h in rows}
    return cycle


def _check_the_batch_span_names_no_owner(spans: list[tuple[Span, ResourceSpans]], cycle: Span,
                                         owners: set[str]) -> None:
    [batch] = [s for s, _ in spans if s.name == BATCH_SPAN]
    attributes = _attributes(batch)
    assert batch.parent_span_id == cycle.span_id
    assert {k: v for k, v in attributes.items() if k.startswith("reminders.batch.")} == {
        "reminders.batch.owners": 3, "reminders.batch.documents": 3,
        "reminders.batch.reminders_sent": 3, "reminders.batch.owners_notified": 3,
        "reminders.batch.failed_owners": 0,
        "reminders.batch.lane": 1,  # a first batch goes to the second claim connection
    }
    assert not [k for k in attributes if "owner_user_id" in k]
    values = [v for value in attributes.values()
              for v in (value if isinstance(value, list) else [value])]
    assert not owners & {str(v) for v in values}


@pytest.mark.parametrize(("protocol", "receiver"), [("grpc", _grpc_receiver),
                                                    ("http/protobuf", _http_receiver)],
                         ids=["grpc", "http-protobuf"])
def test_a_collector_refusing_the_credentials_costs_the_cycle_nothing_and_shows_no_secret(
    documents: Documents, protocol: str, receiver: Any
) -> None:
    documents(expires_at=expiring_in(7))
    with receiver(refuse=True) as (endpoint, received):
        done = subprocess.run(
            [*manage_py(), "run_expiry_reminders", "--as-of", AS_OF.isoformat()],
            capture_output=True, text=True, timeout=120, check=False,
            env=_otel_free_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
                               OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
                               OTEL_EXPORTER_OTLP_HEADERS=f"authorization={SECRET}"),
        )
    assert done.returncode == 0, done.stderr
    assert received.requests  # the spans were offered, with the credentials, and refused
    assert {h.get("authorization") for h in received.headers} == {SECRET}
    exporter_lines = [json.loads(line) for line in done.stderr.splitlines()
                      if '"logger":"opentelemetry.exporter' in line]
    assert exporter_lines and {line["level"] for line in exporter_lines} <= {"warning", "error"}
    assert "s3cret" not in done.stdout + done.stderr
    assert_outbox_matches_contract()


@pytest.mark.parametrize(("variable", "value"), [
    ("OTEL_TRACES_EXPORTER", "zipkin"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
    ("OTEL_EXPORTER_OTLP_HEADERS", f"authorization: {SECRET}"),
])
def test_a_bad_otel_value_exits_2_in_one_line_naming_it(variable: str, value: str) -> None:
    done = subprocess.run(
        [*manage_py(), "run_expiry_reminders", "--as-of", AS_OF.isoformat()],
        capture_output=True, text=True, timeout=120, check=False,
        env=_otel_free_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", **{variable: value}),
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert variable in line
    assert "s3cret" not in done.stdout + done.stderr
