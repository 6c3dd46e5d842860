"""OpenTelemetry set-up by the SDK's own environment configuration (docs/operations.md, Traces).

Off by default: tracing is on when OTEL_TRACES_EXPORTER names an exporter or an OTLP endpoint
is set (OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); OTEL_SDK_DISABLED=true
wins. Once on, the SDK configures itself from the standard OTEL_* variables: its configurator
picks the exporters (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL, through the
installed exporters' `opentelemetry_traces_exporter` entry points), the sampler
(OTEL_TRACES_SAMPLER[_ARG]) and the resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES); the
exporter reads its endpoint, headers, timeout, compression and TLS files, the batch processor
OTEL_BSP_*.

Why the SDK's configurator (`_OTelSDKConfigurator`): it is the code `opentelemetry-instrument`
runs, so every variable means here what it means there, with nothing of ours to drift. The
documented alternatives do not fit: `opentelemetry-instrument` and
`opentelemetry.instrumentation.auto_instrumentation.initialize()` need opentelemetry-distro and
opentelemetry-instrumentation (and patch libraries we do not use); building the provider by
hand re-implements the exporter and protocol choice, which is how OTEL_EXPORTER_OTLP_PROTOCOL
came to be ignored. The SDK documents the configurator as the class a distribution subclasses;
`ReminderConfigurator` is one, and sets its defaults the way opentelemetry-distro does
(`os.environ.setdefault`). The leading underscore means it may change between SDK releases: the
SDK is pinned exactly and tests/integration/test_tracing.py exports over both protocols.

Where we differ from the bare SDK, on purpose:
- an OTLP endpoint alone turns tracing on (OTEL_TRACES_EXPORTER defaults to `otlp` then);
- OTLP's protocol defaults to http/protobuf, the specification's default (the Python SDK keeps
  grpc for backward compatibility), so an endpoint on port 4318 keeps working;
- service.name defaults to `pin-profile-reminders` unless OTEL_SERVICE_NAME or
  OTEL_RESOURCE_ATTRIBUTES names one;
- bad values exit 2 naming the variable (`ConfigError`), checked before the SDK reads them: it
  would raise a traceback for an unknown exporter or protocol, fall back silently from an
  unknown sampler, log a malformed OTEL_EXPORTER_OTLP_HEADERS entry verbatim, secret and all,
  and trust the system's CAs when OTEL_EXPORTER_OTLP_CERTIFICATE names no file. Error messages
  here never quote a header.
"""

import importlib.util
import os
from collections.abc import Mapping, MutableMapping
from importlib.metadata import entry_points

from opentelemetry import trace
from opentelemetry.sdk._configuration import _EXPORTER_BY_OTLP_PROTOCOL, _OTelSDKConfigurator
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.util.re import _DELIMITER_PATTERN, _LIBERAL_HEADER_PATTERN

from core.config import ConfigError

DEFAULT_SERVICE_NAME = "pin-profile-reminders"
DEFAULT_PROTOCOL = "http/protobuf"

SDK_DISABLED = "OTEL_SDK_DISABLED"
TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# The signal's own variable first, then the general one: the order the SDK reads them in.
PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
HEADERS = ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")
TLS_FILES = tuple(f"OTEL_EXPORTER_OTLP{signal}_{kind}" for kind in
                  ("CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE") for signal in ("_TRACES", ""))
SAMPLER = "OTEL_TRACES_SAMPLER"
SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
CONFIG_FILE = "OTEL_CONFIG_FILE"

# The exporter name `otlp` means one of these, by protocol: the SDK configurator's own table
# (grpc: otlp_proto_grpc, http/protobuf: otlp_proto_http).
EXPORTER_BY_PROTOCOL: Mapping[str, str] = _EXPORTER_BY_OTLP_PROTOCOL
_RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")


def _installed(group: str) -> set[str]:
    return set(entry_points(group=group).names)


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def tracing_requested(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces (before any value is checked)."""
    if _is_true(environ.get(SDK_DISABLED)):
        return False
    exporters = environ.get(TRACES_EXPORTER, "")
    if exporters:  # an empty value counts as unset (the specification's rule)
        return exporters.strip().lower() != "none"
    return any(environ.get(name) for name in ENDPOINTS)


def _protocol(environ: Mapping[str, str]) -> tuple[str, str]:
    """(variable, protocol) of the OTLP protocol in force, its default when neither is set."""
    for name in PROTOCOLS:
        if environ.get(name):
            protocol = environ[name].strip()
            if protocol not in EXPORTER_BY_PROTOCOL:
                raise ConfigError(name, f"supported protocols are {' and '.join(EXPORTER_BY_PROTOCOL)}, "
                                        f"got {protocol!r}")
            return name, protocol
    return PROTOCOLS[-1], DEFAULT_PROTOCOL


def trace_exporters(environ: Mapping[str, str]) -> list[str]:
    """The entry-point names of the span exporters the environment asks for, [] when tracing
    is off. Raises ConfigError for any value the SDK would refuse, ignore or log."""
    if not tracing_requested(environ):
        return []
    protocol_variable, protocol = _protocol(environ)
    installed = _installed("opentelemetry_traces_exporter")
    names = [n.strip() for n in (environ.get(TRACES_EXPORTER) or "otlp").split(",")]
    exporters = []
    for name in names:
        exporter = EXPORTER_BY_PROTOCOL[protocol] if name == "otlp" else name
        if exporter not in installed:
            if name == "otlp":
                raise ConfigError(protocol_variable, f"{protocol!r} needs the exporter {exporter}, "
                                                     "which is not installed")
            known = ", ".join(sorted(installed | {"otlp"}))
            raise ConfigError(TRACES_EXPORTER, f"unknown exporter {name!r}; use none, or one or "
                                               f"more of {known}, comma-separated")
        exporters.append(exporter)
    _check_headers(environ)
    _check_tls_files(environ)
    _check_sampler(environ)
    if environ.get(CONFIG_FILE) and importlib.util.find_spec("opentelemetry.configuration") is None:
        raise ConfigError(CONFIG_FILE, "declarative configuration needs the "
                                       "opentelemetry-configuration package, not installed here")
    return exporters


def _check_headers(environ: Mapping[str, str]) -> None:
    # The exporters parse these themselves and log an entry they cannot parse, verbatim: refuse
    # it first, by its position only (the value is a credential more often than not).
    for name in HEADERS:
        entries = _DELIMITER_PATTERN.split(environ.get(name, ""))
        for position, entry in enumerate(entries, start=1):
            if entry and not _LIBERAL_HEADER_PATTERN.fullmatch(entry.strip()):
                raise ConfigError(name, f"entry {position} is not name=value "
                                        "(comma-separated; the value is not shown)")


def _check_tls_files(environ: Mapping[str, str]) -> None:
    # The gRPC exporter logs a missing CA file and goes on with the system's roots: refuse it.
    for name in TLS_FILES:
        path = environ.get(name)
        if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            raise ConfigError(name, f"no readable file at {path}")


def _check_sampler(environ: Mapping[str, str]) -> None:
    sampler = (environ.get(SAMPLER) or "").strip()
    if not sampler:
        return
    installed = _installed("opentelemetry_traces_sampler")
    if sampler not in installed:
        raise ConfigError(SAMPLER, f"unknown sampler {sampler!r}; use one of "
                                   f"{', '.join(sorted(installed))}")
    if sampler in _RATIO_SAMPLERS and environ.get(SAMPLER_ARG):
        try:
            ratio = float(environ[SAMPLER_ARG])
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(SAMPLER_ARG, f"{sampler} takes a ratio from 0 to 1, "
                                           f"got {environ[SAMPLER_ARG]!r}")


class ReminderConfigurator(_OTelSDKConfigurator):
    """The SDK's configurator with this service's defaults, set as a distro sets them."""

    def __init__(self, environ: MutableMapping[str, str]) -> None:
        self.environ = environ

    def _configure(self, **kwargs: object) -> None:
        if not self.environ.get(TRACES_EXPORTER):
            self.environ[TRACES_EXPORTER] = "otlp"  # an endpoint alone turned tracing on
        if not any(self.environ.get(name) for name in PROTOCOLS):
            self.environ[PROTOCOLS[-1]] = DEFAULT_PROTOCOL
        # Resource attributes passed in override the environment's: only a default, then.
        detected = Resource.create().attributes.get(SERVICE_NAME)
        if str(detected).startswith("unknown_service"):
            kwargs["resource_attributes"] = {SERVICE_NAME: DEFAULT_SERVICE_NAME}
        # The SDK's logging handler (deprecated there) stays off: logs are core.logs' JSON lines.
        kwargs["setup_logging_handler"] = False
        super()._configure(**kwargs)  # type: ignore[no-untyped-call]


def configure_tracing() -> TracerProvider | None:
    """Install the global tracer provider when the process environment asks for traces; else
    None. The SDK reads os.environ itself, so this reads (and defaults) nothing else."""
    environ = os.environ
    if not trace_exporters(environ):
        return None
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):  # configured already (under opentelemetry-instrument)
        return current
    try:
        ReminderConfigurator(environ).configure()  # type: ignore[no-untyped-call]
    except RuntimeError as exc:  # what the checks above do not foresee: metrics, logs, ...
        raise ConfigError("OTEL_* (OpenTelemetry SDK)", " ".join(str(exc).split())) from None
    provider = trace.get_tracer_provider()
    return provider if isinstance(provider, TracerProvider) else None
