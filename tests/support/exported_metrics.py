"""What the code exports and what a query names, for the dashboard and rule tests.

`exported_metric_names()` scrapes the real processes (the worker's and the relay's `--loop`
with METRICS_ADDR) once per session and derives every sample name from the families they
serve, so a panel or a rule can only name a metric some process really exports.
`promql_metric_names()` lists the metrics a PromQL expression selects.
"""

import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import command_env, manage_py

DEADLINE_S = 90.0
RELAY_ROLE = "pin_outbox_relay"  # docs/design.md §6; the relay's scrape needs only its name
AUDITOR_ROLE = "pin_reminder_auditor"
# Sample names per family type (the `_created` series are disabled in the code).
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "bool", "offset", "atan2", "inf", "nan"}

_scraped: dict[str, set[str]] = {}


def sample_names(exposition: str) -> set[str]:
    """Every sample name a /metrics text can carry, from its families (also those with no
    sample yet, such as a labelled counter before its first increment)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, keywords or label names)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        if not match[2] and match[1] not in _KEYWORDS:
            names.add(match[1])
    return names


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback only
            return str(response.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return ""


def _wait_for(what: str, probe: Callable[[], str | None], process: subprocess.Popen[str],
              log: Path) -> str:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        value = probe()
        if value:
            return value
        if process.poll() is not None:
            pytest.fail(f"{what}: the process exited {process.returncode}:\n{log.read_text()}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def _listening_port(log: Path) -> str | None:
    match = re.search(r'"event":"metrics server listening".*?"port":(\d+)', log.read_text())
    return match[1] if match else None


def scrape_process(command: list[str], env: dict[str, str], log: Path,
                   ready: Callable[[str, str], bool]) -> str:
    """Start `manage.py COMMAND` with METRICS_ADDR on a free loopback port, scrape /metrics
    until `ready(scraped, log text)`, stop it with SIGTERM and return the scrape."""
    with log.open("w") as stderr:
        process = subprocess.Popen([*manage_py(), *command], text=True, stderr=stderr,
                                   stdout=subprocess.DEVNULL,
                                   env={**env, "METRICS_ADDR": "127.0.0.1:0"})
    try:
        port = _wait_for("the metrics server", lambda: _listening_port(log), process, log)
        url = f"http://127.0.0.1:{port}/metrics"

        def scraped_when_ready() -> str | None:
            text = _get(url)
            return text if text and ready(text, log.read_text()) else None

        return _wait_for(f"{' '.join(command)} metrics", scraped_when_ready, process, log)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
        assert code == 0, log.read_text()


def exported_metric_names(tmp_path: Path, kafka_bootstrap: str) -> set[str]:
    """Sample names the worker, the relay and the audit serve on /metrics (scraped once per
    session). Needs a migrated database the worker role may use, and a broker for the relay."""
    scraped = exported_metric_names_by_process(tmp_path, kafka_bootstrap)
    return scraped["worker"] | scraped["relay"] | scraped["audit"]


def exported_metric_names_by_process(tmp_path: Path, kafka_bootstrap: str) -> dict[str, set[str]]:
    """{"worker": names, "relay": names, "audit": names}: what each process serves (scraped
    once per session)."""
    if not _scraped:
        worker = scrape_process(
            ["run_expiry_reminders", "--loop"], command_env(), tmp_path / "worker.log",
            lambda text, log: '"event":"cycle completed"' in log
            and "profile_document_expiry_reminder_backlog " in text)
        relay_env = {k: v for k, v in command_env(RELAY_ROLE).items()
                     if not k.startswith("OUTBOX_")}
        relay_env.update(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, OUTBOX_POLL_INTERVAL="200ms")
        relay = scrape_process(
            ["publish_outbox", "--loop"], relay_env, tmp_path / "relay.log",
            lambda text, _log: "profile_outbox_unpublished_messages " in text)
        audit = scrape_process(
            ["audit_reminders", "--loop"], command_env(AUDITOR_ROLE), tmp_path / "audit.log",
            lambda text, log: '"event":"audit completed"' in log
            and "profile_document_expiry_reminder_audit_findings{" in text)
        _scraped["worker"], _scraped["relay"] = sample_names(worker), sample_names(relay)
        _scraped["audit"] = sample_names(audit)
    return dict(_scraped)
