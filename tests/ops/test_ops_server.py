"""The operations server: in process with fake probes, then the real worker (`--loop` with
METRICS_ADDR) scraped by the Prometheus text parser and by a real Prometheus server."""

import json
import queue
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from core import build
from core.health import Verdict
from core.ops_server import REQUEST_TIMEOUT_S, OpsServer, Probes, RecentVerdict
from reminders.config import DEFAULT_THRESHOLDS
from tests.support.contract import assert_outbox_matches_contract
from tests.support.db_roles import test_database_url
from tests.support.factories import Documents
from tests.support.ledger import expiring_in, real_today, run_as_ofs
from tests.support.processes import command_env, manage_py
from tests.support.reference import ReferenceLedger, documents_from_database

T = TypeVar("T")
DEADLINE_S = 60.0


def wait_for(what: str, probe: Callable[[], T | None], deadline_s: float = DEADLINE_S) -> T:
    """Poll `probe` until it returns something truthy, or fail after the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback only
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return 0, ""  # not listening yet


def test_server_answers_metrics_health_and_readiness() -> None:
    registry = CollectorRegistry()
    Counter("demo_things", "Things.", registry=registry).inc(3)
    ready = [True]
    server = OpsServer("127.0.0.1", 0, Probes(
        liveness=lambda: Verdict(False, "stuck: test"),
        readiness=lambda: Verdict(ready[0], "ok" if ready[0] else "database unavailable"),
    ), registry, readiness_max_age_s=0).start()
    base = f"http://127.0.0.1:{server.address[1]}"
    try:
        status, text = get(f"{base}/metrics")
        assert status == 200 and "demo_things_total 3.0" in text
        assert get(f"{base}/healthz") == (503, "stuck: test\n")
        assert get(f"{base}/readyz") == (200, "ok\n")
        ready[0] = False
        assert get(f"{base}/readyz")[0] == 503
        assert get(f"{base}/nothing")[0] == 404
    finally:
        server.stop()


def test_every_server_exports_the_build_it_runs() -> None:
    server = OpsServer("127.0.0.1", 0, Probes(liveness=lambda: Verdict(True, "ok"),
                                              readiness=lambda: Verdict(True, "ok")),
                       CollectorRegistry()).start()
    try:
        status, text = get(f"http://127.0.0.1:{server.address[1]}/metrics")
    finally:
        server.stop()

    assert status == 200
    [family] = [f for f in text_string_to_metric_families(text)
                if f.name == "pin_profile_reminders_build_info"]
    [only] = family.samples
    assert family.type == "gauge" and only.value == 1.0
    assert only.labels == {"version": build.version(), "revision": build.revision()}
    assert build.revision() != build.UNKNOWN and build.version() in build.describe()


def test_idle_connections_do_not_stop_the_server_answering() -> None:
    """200 connections that never send a byte (and one that sends half a request): /healthz
    still answers at once, and the idle ones are closed after the request timeout."""
    server = OpsServer("127.0.0.1", 0, Probes(liveness=lambda: Verdict(True, "ok"),
                                              readiness=lambda: Verdict(True, "ok"))).start()
    port = server.address[1]
    idle: list[socket.socket] = []
    try:
        for _ in range(200):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        idle[0].sendall(b"GET /healthz HTTP/1.1\r\n")  # and never the rest
        started = time.monotonic()
        for _ in range(20):
            assert get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")
        assert time.monotonic() - started < 5
        # Past the request timeout the server has closed them: a read sees the end.
        idle[1].settimeout(REQUEST_TIMEOUT_S + 5)
        assert idle[1].recv(1) == b""
    finally:
        for conn in idle:
            conn.close()
        server.stop()


def test_readiness_is_checked_once_a_second_and_a_slow_check_holds_one_caller() -> None:
    now, calls, release = [0.0], [], threading.Event()

    def probe() -> Verdict:
        calls.append(now[0])
        if len(calls) == 2:
            release.wait(timeout=10)  # the database is slow this time
        return Verdict(len(calls) == 1, f"check {len(calls)}")

    ready = RecentVerdict(probe, max_age_s=1.0, clock=lambda: now[0])
    assert [ready() for _ in range(100)] == [Verdict(True, "check 1")] * 100
    now[0] = 1.5
    slow = threading.Thread(target=ready)
    slow.start()
    wait_for("the slow check", lambda: len(calls) == 2)
    assert ready() == Verdict(True, "check 1")  # the last verdict, not a wait
    release.set()
    slow.join(timeout=10)
    assert ready() == Verdict(False, "check 2") and len(calls) == 2


READINESS_APP = "pin-ops-readiness-burst"


def _readiness_backends(seen: set[int], stop: threading.Event) -> None:
    with psycopg.connect(test_database_url(), autocommit=True) as watcher:
        while not stop.is_set():
            seen.update(pid for (pid,) in watcher.execute(
                "select pid from pg_stat_activity where application_name = %s",
                [READINESS_APP]).fetchall())
            time.sleep(0.005)


def test_a_burst_of_readiness_checks_opens_a_handful_of_database_connections(
    transactional_db: None,
) -> None:
    """500 /readyz from 50 clients at once, against a worker's server with the real readiness
    check: the database sees a few backends of the worker's name, not hundreds."""
    with worker_loop(DB_APPLICATION_NAME=READINESS_APP) as worker:
        port = worker.wait_event("metrics server listening")["port"]
        worker.wait_event("cycle completed")
        seen: set[int] = set()
        stop = threading.Event()
        watcher = threading.Thread(target=_readiness_backends, args=(seen, stop), daemon=True)
        watcher.start()
        time.sleep(0.2)
        before = set(seen)
        with ThreadPoolExecutor(50) as clients:
            answers = list(clients.map(lambda _: get(f"http://127.0.0.1:{port}/readyz"),
                                       range(500)))
        time.sleep(0.2)
        stop.set()
        watcher.join(timeout=10)

    assert Tally(answers) == {(200, "ok\n"): 500}
    assert len(seen - before) <= 5, f"{len(seen - before)} backends for 500 readiness checks"


@dataclass
class Worker:
    process: subprocess.Popen[str]
    lines: "queue.Queue[dict[str, Any]]" = field(default_factory=queue.Queue)
    seen: list[dict[str, Any]] = field(default_factory=list)

    def wait_event(self, event: str) -> dict[str, Any]:
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            for line in self.seen:
                if line.get("event") == event:
                    return line
            try:
                self.seen.append(self.lines.get(timeout=0.5))
            except queue.Empty:
                assert self.process.poll() is None, f"worker exited: {self.seen[-5:]}"
        pytest.fail(f"timed out waiting for the worker's {event!r}")


@contextmanager
def worker_loop(**env: str) -> Iterator[Worker]:
    process = subprocess.Popen(
        [*manage_py(), "run_expiry_reminders", "--loop"],
        env=command_env(METRICS_ADDR="127.0.0.1:0", **env),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    worker = Worker(process)

    def pump() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            if raw.startswith("{"):
                worker.lines.put(json.loads(raw))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        yield worker
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
        reader.join(timeout=10)
        assert process.stderr is not None
        process.stderr.close()
    assert code == 0


def _documents_for_demo(documents: Documents) -> None:
    """Documents due at every threshold on the day the worker's clock reads now."""
    today = real_today()  # `--loop` runs as of its clock: build from the same clock
    owner = documents(expires_at=expiring_in(7, base=today)).owner_user_id
    documents(owner_user_id=owner, expires_at=expiring_in(29, base=today))
    documents(expires_at=expiring_in(1, base=today))
    documents(expires_at=expiring_in(-5, base=today))
    documents(expires_at=expiring_in(100, base=today))


def _expected_reminders() -> tuple[dict[str, int], int]:
    """Reminders per threshold and owners told, by the reference model at the as-of the
    worker's cycle ran at (a UTC midnight may fall between building the data and the cycle)."""
    [as_of] = run_as_ofs()
    model = ReferenceLedger()
    model.run(documents_from_database(), as_of, DEFAULT_THRESHOLDS)
    told = Tally(str(item["thresholdDays"]) for items in model.events.values()
                   for item in items.values())
    per_threshold = {str(t): told[str(t)] for t in DEFAULT_THRESHOLDS}
    assert sum(per_threshold.values()) == 4 and len(model.events) == 3, per_threshold
    return per_threshold, len(model.events)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, keyed by (name, sorted labels), via the Prometheus parser."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.real_clock
def test_worker_serves_metrics_of_its_cycle(documents: Documents) -> None:
    _documents_for_demo(documents)
    with worker_loop() as worker:
        port = worker.wait_event("metrics server listening")["port"]
        completed = worker.wait_event("cycle completed")
        base = f"http://127.0.0.1:{port}"
        status, text = get(f"{base}/metrics")
        health, ready = get(f"{base}/healthz"), get(f"{base}/readyz")

    assert completed["status"] == "succeeded" and status == 200
    expected, owners_told = _expected_reminders()
    scraped = samples(text)
    per_threshold = {dict(labels)["threshold_days"]: value for (name, labels), value in scraped.items()
                     if name == "profile_document_expiry_reminders_total"}
    assert per_threshold == expected
    assert scraped[("profile_document_expiry_reminder_cycle_duration_seconds_count", ())] == 1
    assert scraped[("profile_document_expiry_reminder_errors_total", ())] == 0
    assert scraped[("profile_document_expiry_reminder_backlog", ())] == 0
    assert scraped[("profile_document_expiry_reminder_cycles_total", (("status", "succeeded"),))] == 1
    assert abs(scraped[("profile_document_expiry_reminder_last_success_timestamp_seconds", ())]
               - time.time()) < 120
    assert scraped[("profile_outbox_unpublished_messages", ())] == owners_told
    assert scraped[("profile_outbox_parked_messages", ())] == 0
    assert scraped[("profile_outbox_oldest_unpublished_age_seconds", ())] >= 0
    assert health[0] == 200 and health[1].startswith("ok")
    assert ready == (200, "ok\n")
    assert_outbox_matches_contract()


def test_bad_metrics_address_is_a_usage_error(transactional_db: None) -> None:
    done = subprocess.run([*manage_py(), "run_expiry_reminders", "--loop"],
                          env=command_env(METRICS_ADDR="nowhere"), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and "METRICS_ADDR" in done.stderr


def _listening_address(log: Path) -> str | None:
    """The address Prometheus bound (it was given port 0), from its log line."""
    match = re.search(r'msg="Listening on" address=(127\.0\.0\.1:\d+)', log.read_text())
    return match.group(1) if match else None


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    status, body = get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    if status != 200:
        return []
    result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
    return result


def _query_rows(base: str, promql: str, rows: int) -> list[dict[str, Any]] | None:
    result = _query(base, promql)
    return result if len(result) == rows else None


@pytest.mark.real_clock
def test_a_real_prometheus_scrapes_the_worker(documents: Documents, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: scripts/test.sh installs Debian's prometheus package"
    _documents_for_demo(documents)
    with worker_loop() as worker:
        target = f"127.0.0.1:{worker.wait_event('metrics server listening')['port']}"
        worker.wait_event("cycle completed")
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: document-expiry-reminder-worker\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        log_path = tmp_path / "prometheus.log"
        log = log_path.open("w")
        # Port 0: Prometheus binds a free port itself and logs it, so no other process can
        # take the port between our choice and its bind.
        server = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             "--web.listen-address=127.0.0.1:0", "--log.level=info"],
            stdout=subprocess.DEVNULL, stderr=log,
        )
        try:
            address = wait_for("prometheus to listen", lambda: _listening_address(log_path)
                               if server.poll() is None else pytest.fail("prometheus exited"))
            base = f"http://{address}"
            wait_for("prometheus to be ready", lambda: get(f"{base}/-/ready")[0] == 200
                     if server.poll() is None else pytest.fail("prometheus exited"))
            result = wait_for("the counter in prometheus", lambda: _query(
                base, "sum(profile_document_expiry_reminders_total)"))
            up = _query(base, 'up{job="document-expiry-reminder-worker"}')
            by_threshold = wait_for("every threshold", lambda: _query_rows(
                base, "profile_document_expiry_reminders_total", 4))
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()

    expected, _ = _expected_reminders()
    assert float(result[0]["value"][1]) == sum(expected.values())
    assert [float(u["value"][1]) for u in up] == [1]
    assert {r["metric"]["threshold_days"]: float(r["value"][1]) for r in by_threshold} == expected
    assert_outbox_matches_contract()
