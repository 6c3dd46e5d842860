"""The operations HTTP server of the long-running commands: `/metrics` (Prometheus),
`/healthz` (liveness) and `/readyz` (readiness), on METRICS_ADDR (unset = no server).
`operations_server` is the one wiring every `--loop` uses (the worker's, the relay's, the audit's).

It runs on daemon threads beside the loop; each request is answered on its own thread.
"""

import logging
import re
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from core import gauges
from core.config import ConfigError
from core.health import Verdict
from core.logs import leave_stop_signals_to_the_main_thread, log_event

logger = logging.getLogger("core.ops_server")

Probe = Callable[[], Verdict]
_ADDR = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})$")


def parse_listen_addr(name: str, raw: str) -> tuple[str, int]:
    """`127.0.0.1:9108`, `[::1]:9108`, `:9108` (all interfaces) or port 0 (any free port)."""
    match = _ADDR.match(raw.strip())
    if not match or int(match["port"]) > 65535:
        raise ConfigError(name, f"expected HOST:PORT like 127.0.0.1:9108, got {raw!r}")
    return match["v6"] or match["host"] or "", int(match["port"])


@dataclass(frozen=True, slots=True)
class Probes:
    liveness: Probe
    readiness: Probe


def _handler(registry: CollectorRegistry, probes: Probes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "pin-profile-ops"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._reply(200, encoder(registry), content_type)
            elif path in ("/healthz", "/readyz"):
                verdict = (probes.liveness if path == "/healthz" else probes.readiness)()
                self._reply(200 if verdict.ok else 503, f"{verdict.reason}\n".encode(),
                            "text/plain; charset=utf-8")
            else:
                self._reply(404, b"not found: try /metrics, /healthz or /readyz\n",
                            "text/plain; charset=utf-8")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes and probes every few seconds would drown the worker's own log

    return Handler


class _Server4(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server4):
    address_family = socket.AF_INET6


class OpsServer:
    """A running server; `address` is where it listens (the real port when 0 was asked)."""

    def __init__(self, host: str, port: int, probes: Probes,
                 registry: CollectorRegistry = REGISTRY) -> None:
        server_class = _Server6 if ":" in host else _Server4
        self._httpd = server_class((host, port), _handler(registry, probes))
        self._thread = threading.Thread(target=self._serve, name="ops-server", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def _serve(self) -> None:
        leave_stop_signals_to_the_main_thread()  # request threads inherit the mask
        self._httpd.serve_forever()

    def start(self) -> "OpsServer":
        self._thread.start()
        host, port = self.address
        log_event(logger, logging.INFO, "metrics server listening", host=host, port=port,
                  endpoints=["/metrics", "/healthz", "/readyz"])
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def ops_server_from_env(environ: Mapping[str, str], probes: Probes,
                        registry: CollectorRegistry = REGISTRY) -> OpsServer | None:
    """The server METRICS_ADDR asks for (not started), or None when it is unset or empty."""
    raw = environ.get("METRICS_ADDR", "").strip()
    if not raw:
        return None
    host, port = parse_listen_addr("METRICS_ADDR", raw)
    try:
        return OpsServer(host, port, probes, registry)
    except OSError as exc:
        raise ConfigError("METRICS_ADDR", f"cannot listen on {raw!r}: {exc.strerror}") from None


@contextmanager
def operations_server(
    environ: Mapping[str, str], probes: Probes, *, prepare: Callable[[], object] = lambda: None,
    using: str = "default",
) -> Iterator[tuple[gauges.DatabaseGauges, ...] | None]:
    """Around a `--loop`: the server METRICS_ADDR asks for, with the gauges every app offers
    (core.gauges) and what `prepare()` registers installed before it starts; stopped on the
    way out. Yields the offered gauges installed, or None when no server was asked for."""
    server = ops_server_from_env(environ, probes)
    if server is None:
        yield None
        return
    offered = gauges.install(using)
    prepare()
    server.start()
    try:
        yield offered
    finally:
        server.stop()
