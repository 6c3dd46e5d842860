"""Run the worker's management commands as subprocesses, as production does, and read back
their summary and peak memory."""

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MANAGE_PY = ROOT / "manage.py"

_SUMMARY = {
    "window_documents": "documents in window",
    "due_documents": "due documents",
    "reminders_sent": "reminders sent",
    "owners_notified": "owners notified",
    "markers_written": "markers written",
    "markers_rearmed": "markers re-armed",
    "pruned": "pruned markers",
    "failed_owners": "failed owners",
    "duration_ms": "duration",
}
_STATUS = re.compile(r"^Cycle \S+ as of \S+: (\w+)$", re.MULTILINE)
_PRUNED = re.compile(r"^pruned (\d+) marker", re.MULTILINE)


@dataclass(slots=True)
class WorkerRun:
    """One command run: wall seconds (process start to exit), peak RSS, CPU seconds (user and
    system, the worker process only), and its summary."""

    wall_seconds: float
    peak_rss_mb: float
    cpu_seconds: float
    returncode: int
    status: str
    counters: dict[str, int] = field(default_factory=dict)
    log_lines: int = 0


def _parse_counters(stdout: str) -> dict[str, int]:
    counters: dict[str, int] = {}
    for key, label in _SUMMARY.items():
        match = re.search(rf"^\s+{label}\s+(\d+)", stdout, re.MULTILINE)
        if match:
            counters[key] = int(match[1])
    if (pruned := _PRUNED.search(stdout)) is not None:
        counters["pruned"] = int(pruned[1])
    return counters


def run_command(args: list[str], database_url: str, log_path: Path,
                env: dict[str, str] | None = None) -> WorkerRun:
    """Run `manage.py <args>` and wait for it."""
    return run_python([str(MANAGE_PY), *args], database_url, log_path, env)


def run_python(argv: list[str], database_url: str, log_path: Path,
               env: dict[str, str] | None = None) -> WorkerRun:
    """Run `python <argv>` as the worker runs, and read its summary, its own peak RSS (written
    by bench.peak_rss: wait4's would count this process's) and its CPU (wait4's)."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("REMINDER_")}
    child_env.update(DATABASE_URL=database_url, LOG_FORMAT="json", PYTHONUNBUFFERED="1",
                     REMINDER_MAX_RUN_DURATION="6h", DB_STATEMENT_TIMEOUT_MS="3600000")
    child_env.update(env or {})  # may set the budget, e.g. REMINDER_MAX_RUN_DURATION=10m
    out_path = log_path.with_suffix(".out")
    rss_path = log_path.with_suffix(".rss")
    rss_path.unlink(missing_ok=True)
    started = time.perf_counter()
    with out_path.open("w") as out, log_path.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "bench.peak_rss", str(rss_path), *argv],
                                stdout=out, stderr=err, env=child_env, cwd=ROOT)
        _, wait_status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(wait_status)
    stdout = out_path.read_text()
    with log_path.open() as log:
        lines = sum(1 for _ in log)
    status = _STATUS.search(stdout)
    return WorkerRun(
        wall_seconds=wall,
        # nan: no report, the child died by a signal before its exit handlers ran
        peak_rss_mb=float(rss_path.read_text()) if rss_path.exists() else float("nan"),
        cpu_seconds=usage.ru_utime + usage.ru_stime,
        returncode=proc.returncode,
        status=status[1] if status else ("done" if proc.returncode == 0 else "error"),
        counters=_parse_counters(stdout),
        log_lines=lines,
    )


def run_cycle(as_of: datetime, database_url: str, log_path: Path,
              env: dict[str, str] | None = None) -> WorkerRun:
    return run_command(["run_expiry_reminders", "--as-of", as_of.isoformat()], database_url,
                       log_path, env)


def run_prune(as_of: datetime, database_url: str, log_path: Path) -> tuple[WorkerRun, float]:
    """The worker's prune at `as_of`, and its seconds measured inside the process."""
    run = run_python(["-m", "bench.timed_prune", as_of.date().isoformat()], database_url,
                     log_path)
    timed = json.loads(log_path.with_suffix(".out").read_text())
    run.counters["pruned"] = int(timed["pruned"])
    return run, float(timed["seconds"])


def run_relay(database_url: str, bootstrap: str, log_path: Path) -> tuple[WorkerRun, dict[str, Any]]:
    """One relay pass (`publish_outbox`) to the brokers at `bootstrap`, and what it reported:
    its seconds measured inside the process, how many it published, its error if any."""
    run = run_python(["-m", "bench.timed_relay"], database_url, log_path,
                     {"KAFKA_BOOTSTRAP_SERVERS": bootstrap})
    out = log_path.with_suffix(".out").read_text().strip().splitlines()
    reported: dict[str, Any] = json.loads(out[-1]) if out else {}
    return run, reported
