"""The operations server: in process with fake probes, then the real worker (`--loop` with
METRICS_ADDR) scraped by the Prometheus text parser and by a real Prometheus server."""

import json
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from core.health import Verdict
from core.ops_server import OpsServer, Probes
from reminders.config import DEFAULT_THRESHOLDS
from tests.conftest import command_env, manage_py
from tests.support.factories import Documents
from tests.support.ledger import expiring_in, real_today, run_as_ofs
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
    ), registry).start()
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
