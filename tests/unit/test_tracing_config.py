"""OTEL_* checks before the OpenTelemetry SDK configures itself (core.tracing): when tracing is
on, which exporters the SDK will build, and a one-line ConfigError naming the variable for any
value it would refuse with a traceback, ignore, or log."""

from pathlib import Path

import pytest

from core.config import ConfigError
from core.tracing import trace_exporters, tracing_requested


@pytest.mark.parametrize(("environ", "exporters"), [
    ({}, []),
    ({"OTEL_TRACES_EXPORTER": ""}, []),
    ({"OTEL_TRACES_EXPORTER": "none"}, []),
    ({"OTEL_TRACES_EXPORTER": " None ", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, []),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, []),
    ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, []),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp_proto_http"]),  # the specification's default
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ["otlp_proto_http"]),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp_proto_http"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     ["otlp_proto_grpc"]),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": " http/protobuf "}, ["otlp_proto_http"]),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "",
      "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, ["otlp_proto_grpc"]),
    ({"OTEL_TRACES_EXPORTER": "otlp_proto_grpc"}, ["otlp_proto_grpc"]),
    ({"OTEL_TRACES_EXPORTER": "otlp, console"}, ["otlp_proto_http", "console"]),
])
def test_which_exporters_the_environment_asks_for(
    environ: dict[str, str], exporters: list[str]
) -> None:
    assert trace_exporters(environ) == exporters
    assert tracing_requested(environ) == bool(exporters)


ON = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}


@pytest.mark.parametrize(("environ", "variable", "problem"), [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER", "unknown exporter 'zipkin'"),
    ({"OTEL_TRACES_EXPORTER": "OTLP"}, "OTEL_TRACES_EXPORTER", "unknown exporter 'OTLP'"),
    ({"OTEL_TRACES_EXPORTER": "otlp,"}, "OTEL_TRACES_EXPORTER", "unknown exporter ''"),
    ({"OTEL_TRACES_EXPORTER": "otlp,none"}, "OTEL_TRACES_EXPORTER", "unknown exporter 'none'"),
    ({**ON, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL",
     "supported protocols are grpc and http/protobuf, got 'http/json'"),
    ({**ON, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "gRPC"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
     "got 'gRPC'"),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_PROTOCOL": "udp"},
     "OTEL_EXPORTER_OTLP_PROTOCOL", "got 'udp'"),
    ({**ON, "OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER", "unknown sampler"),
    ({**ON, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
     "OTEL_TRACES_SAMPLER_ARG", "a ratio from 0 to 1, got 'half'"),
    ({**ON, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
     "OTEL_TRACES_SAMPLER_ARG", "got '2'"),
    ({**ON, "OTEL_CONFIG_FILE": "/etc/otel.yaml"}, "OTEL_CONFIG_FILE", "not installed"),
    ({**ON, "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"},
     "OTEL_EXPORTER_OTLP_CERTIFICATE", "no readable file at /nonexistent/ca.pem"),
    ({**ON, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": "/"}, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
     "no readable file at /"),
])
def test_a_bad_value_names_its_variable(
    environ: dict[str, str], variable: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        trace_exporters(environ)
    assert raised.value.name == variable
    assert problem in str(raised.value)
    assert "\n" not in str(raised.value)


def test_bad_values_are_not_checked_while_tracing_is_off() -> None:
    assert trace_exporters({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}) == []
    assert trace_exporters({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "zipkin"}) == []


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_HEADERS",
                                      "OTEL_EXPORTER_OTLP_TRACES_HEADERS"])
def test_a_malformed_header_is_refused_without_showing_its_value(variable: str) -> None:
    environ = {**ON, variable: "x-tenant=pin,authorization: Bearer s3cret-t0ken"}
    with pytest.raises(ConfigError) as raised:
        trace_exporters(environ)
    assert raised.value.name == variable
    assert "entry 2 is not name=value" in str(raised.value)
    assert "s3cret" not in str(raised.value) and "Bearer" not in str(raised.value)


def test_well_formed_headers_pass() -> None:
    environ = {**ON, "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret, x-tenant=pin%20a"}
    assert trace_exporters(environ) == ["otlp_proto_http"]


def test_tls_files_that_exist_pass(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert trace_exporters({**ON, "OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca),
                            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == ["otlp_proto_grpc"]
