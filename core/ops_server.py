"""The operations HTTP server of the long-running commands: `/metrics` (Prometheus; every
server also exports `pin_profile_reminders_build_info`, core.build), `/healthz` (liveness) and
`/readyz` (readiness), on METRICS_ADDR (unset = no server).
`operations_server` is the one wiring every `--loop` uses (the worker's, the relay's, the audit's).

It runs on daemon threads beside the loop and cannot be exhausted (docs/operations.md,
"Security"): one thread waits on every connection at once and hands a connection to one of a
few request threads only once its request has started to arrive; a connection idle or slow past
REQUEST_TIMEOUT_S is closed, and past MAX_CONNECTIONS the oldest waiting one is. Readiness is
answered from a verdict at most READINESS_MAX_AGE_S old, so a burst of `/readyz` costs the
database one check (one connection) a second.
"""

import logging
import queue
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from core import gauges
from core.build import install_build_info
from core.config import ConfigError
from core.health import Verdict
from core.logs import leave_stop_signals_to_the_main_thread, log_event

logger = logging.getLogger("core.ops_server")

Probe = Callable[[], Verdict]
# A request must arrive whole, and its answer be taken, within this many seconds.
REQUEST_TIMEOUT_S = 5.0
# Requests answered at once, connections open at once (the oldest idle one closed past it),
# and requests arrived but not yet answered (a connection past it is closed unanswered).
REQUEST_THREADS = 4
MAX_CONNECTIONS = 1_000
MAX_QUEUED = 64
READINESS_MAX_AGE_S = 1.0
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


class RecentVerdict:
    """A probe answered from its last verdict while that is at most `max_age_s` old. One caller
    at a time runs the probe; the others take the last verdict meanwhile (a slow database holds
    one request thread, not all), or, before the first, wait for it."""

    def __init__(self, probe: Probe, max_age_s: float = READINESS_MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._probe, self._max_age_s, self._clock = probe, max_age_s, clock
        self._lock = threading.Lock()
        self._last: tuple[float, Verdict] | None = None

    def __call__(self) -> Verdict:
        last = self._last
        if last is not None and self._clock() - last[0] <= self._max_age_s:
            return last[1]
        if not self._lock.acquire(blocking=last is None):
            return last[1]  # type: ignore[index]  # another caller is checking
        try:
            last = self._last
            if last is None or self._clock() - last[0] > self._max_age_s:
                last = self._last = (self._clock(), self._probe())
            return last[1]
        finally:
            self._lock.release()


def _handler(registry: CollectorRegistry, probes: Probes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "pin-profile-ops"
        timeout = REQUEST_TIMEOUT_S

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


class OpsServer:
    """A running server; `address` is where it listens (the real port when 0 was asked)."""

    def __init__(self, host: str, port: int, probes: Probes,
                 registry: CollectorRegistry = REGISTRY, *,
                 readiness_max_age_s: float = READINESS_MAX_AGE_S) -> None:
        install_build_info(registry)  # every server says which build answers
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=128)
        self._listener.setblocking(False)
        cached = Probes(liveness=probes.liveness, readiness=RecentVerdict(probes.readiness,
                                                                   readiness_max_age_s))
        self._handler = _handler(registry, cached)
        self._arrived: queue.Queue[tuple[socket.socket, Any] | None] = queue.Queue(MAX_QUEUED)
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._wait_for_requests, name="ops-server",
                                          daemon=True)]
        self._threads += [threading.Thread(target=self._answer_requests, name=f"ops-request-{n}",
                                           daemon=True) for n in range(REQUEST_THREADS)]

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def _wait_for_requests(self) -> None:
        """Accept every connection, and queue each once its request starts to arrive."""
        leave_stop_signals_to_the_main_thread()
        waiting: dict[socket.socket, tuple[float, Any]] = {}  # oldest first: (deadline, peer)
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in selector.select(timeout=0.25):
                    if key.fileobj is self._listener:
                        with suppress(BlockingIOError, InterruptedError):
                            conn, peer = self._listener.accept()
                            if len(waiting) >= MAX_CONNECTIONS:
                                oldest = next(iter(waiting))
                                selector.unregister(oldest)
                                del waiting[oldest]
                                oldest.close()
                            selector.register(conn, selectors.EVENT_READ)
                            waiting[conn] = (time.monotonic() + REQUEST_TIMEOUT_S, peer)
                        continue
                    conn = key.fileobj  # type: ignore[assignment]
                    selector.unregister(conn)
                    _, peer = waiting.pop(conn)
                    try:
                        self._arrived.put_nowait((conn, peer))
                    except queue.Full:
                        conn.close()
                now = time.monotonic()
                for conn in [c for c, (deadline, _) in waiting.items() if deadline < now]:
                    selector.unregister(conn)
                    del waiting[conn]
                    conn.close()
        for conn in waiting:
            conn.close()

    def _answer_requests(self) -> None:
        leave_stop_signals_to_the_main_thread()
        while (arrived := self._arrived.get()) is not None:
            conn, peer = arrived
            try:
                conn.setblocking(True)
                self._handler(conn, peer, self)  # type: ignore[arg-type]  # it reads no server
            except OSError:
                pass  # the client went away or was too slow (REQUEST_TIMEOUT_S)
            finally:
                with suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()

    def start(self) -> "OpsServer":
        for thread in self._threads:
            thread.start()
        host, port = self.address
        log_event(logger, logging.INFO, "metrics server listening", host=host, port=port,
                  endpoints=["/metrics", "/healthz", "/readyz"])
        return self

    def stop(self) -> None:
        """Stop accepting first, so that nothing is queued behind the request threads' stop;
        a connection still queued then is closed unanswered, never left to the collector."""
        self._stopping.set()
        waiter, answerers = self._threads[0], self._threads[1:]
        if waiter.is_alive():
            waiter.join(timeout=5)
        for _ in answerers:
            with suppress(queue.Full):
                self._arrived.put(None, timeout=1)
        for thread in answerers:
            if thread.is_alive():
                thread.join(timeout=5)
        while True:
            try:
                arrived = self._arrived.get_nowait()
            except queue.Empty:
                break
            if arrived is not None:
                arrived[0].close()
        self._listener.close()


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
