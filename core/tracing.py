"""OpenTelemetry set-up from the standard environment variables.

Off by default. On when OTEL_TRACES_EXPORTER names an exporter (`otlp`, `console`) or an
OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
OTEL_SDK_DISABLED=true wins. The exporter and the batch processor read the other standard
OTEL_* variables themselves (endpoint, headers, timeouts, OTEL_SERVICE_NAME, ...).
"""

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from core.config import ConfigError

DEFAULT_SERVICE_NAME = "pin-profile-reminders"
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
