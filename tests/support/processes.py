"""Run `manage.py` commands as real subprocesses on the test database (their command line and
environment: `manage_py`, `command_env`) and watch their JSON log lines."""

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.roles import WORKER_ROLE
from tests.support.db_roles import test_database_url

ROOT = Path(__file__).resolve().parents[2]  # the repository's root, where manage.py is


def manage_py() -> list[str]:
    """The command line of `manage.py`, on this interpreter."""
    return [sys.executable, str(ROOT / "manage.py")]


def command_env(role: str = WORKER_ROLE, **extra: str) -> dict[str, str]:
    """Environment for a `manage.py` subprocess on the test database as `role`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMINDER_")}
    env.update(DATABASE_URL=test_database_url(role), LOG_FORMAT="json",
               PYTHONUNBUFFERED="1", **extra)
    return env


class Command:
    """A running `manage.py` command whose stderr JSON lines are collected as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [*manage_py(), *args], env=env or command_env(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        self.stdout: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._out_reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._out_reader.start()

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        self.stdout.extend(self.process.stdout)

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line)
            try:
                self.lines.put(json.loads(line))
            except json.JSONDecodeError:
                continue

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        """The first log line matching `predicate`; fails after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    self._reader.join(timeout=5)
                    if self.lines.empty():
                        break
                continue
            if predicate(line):
                return line
        raise AssertionError(f"no matching log line; stderr:\n{''.join(self.stderr)[-3000:]}")

    def wait_for_event(self, event: str, timeout: float = 60) -> dict[str, Any]:
        return self.wait_for(lambda line: line.get("event") == event, timeout)

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) once the process ends."""
        self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        self._out_reader.join(timeout=10)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return self.process.returncode, "".join(self.stdout), "".join(self.stderr)


def run_command(*args: str, env: dict[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a command to its end."""
    return subprocess.run([*manage_py(), *args], env=env or command_env(), capture_output=True,
                          text=True, timeout=timeout, check=False)
