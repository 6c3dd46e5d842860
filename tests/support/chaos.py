"""Tools of the chaos scenarios: seeded document sets loaded with COPY, worker subprocesses
whose log lines are collected as they come, waiting on conditions with a deadline, and the
worker's database sessions as seen from pg_stat_activity."""

import json
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from django.db import connection

from core.roles import WORKER_ROLE
from devtools.demo_data import copy_documents
from tests.support.db_roles import test_database_url
from tests.support.processes import command_env, manage_py

TYPES = ("Passport", "InternationalPassport", "DriverLicense", "ResidencePermit", "Visa")


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str,
               every: float = 0.05) -> None:
    """Poll `condition` until it holds; fail after `timeout` seconds saying what was awaited."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        threading.Event().wait(every)


def scalar(sql: str, params: tuple[Any, ...] = ()) -> Any:
    """One value, read as the tables' owner."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else row[0]


def outbox_count() -> int:
    return int(scalar("select count(*) from outbox_messages"))


def load_spread_documents(count: int, around: datetime, seed: int, *,
                          span_days: tuple[int, int] = (-95, 40)) -> int:
    """`count` documents over about count/3 owners, expiring between `span_days` around the
    date `around`, at random times of day; a few without expiry, archived or deleted."""
    rng = random.Random(seed)
    now = datetime(2020, 1, 1, tzinfo=UTC)

    def rows() -> Iterator[tuple[object, ...]]:
        made = 0
        while made < count:
            owner = uuid.UUID(int=rng.getrandbits(128), version=4)
            person = uuid.UUID(int=rng.getrandbits(128), version=4)
            for _ in range(min(rng.randint(1, 5), count - made)):
                made += 1
                expires: datetime | None = around + timedelta(
                    days=rng.randint(*span_days), minutes=rng.randint(0, 1439) - 720)
                if rng.random() < 0.03:
                    expires = None
                status = "Archived" if rng.random() < 0.03 else "Active"
                deleted = now if rng.random() < 0.03 else None
                yield (uuid.UUID(int=rng.getrandbits(128), version=4), owner, person,
                       rng.choice(TYPES), f"{rng.randint(10, 99)} ** ****{rng.randint(10, 99)}",
                       expires, status, deleted, rng.randbytes(16), now, now)

    return copy_documents(rows())


@dataclass
class Worker:
    """A `manage.py run_expiry_reminders` subprocess; its stderr lines collected as they come."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @classmethod
    def start(cls, *args: str, role: str = WORKER_ROLE, **env: str) -> "Worker":
        environment = command_env(role)
        environment.update(env)
        proc = subprocess.Popen(
            [*manage_py(), "run_expiry_reminders", *args], env=environment,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        worker = cls(proc)
        worker._reader = threading.Thread(target=worker._read, daemon=True)
        worker._reader.start()
        return worker

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines so far (Django's final `CommandError: ...` line is plain text)."""
        return [json.loads(line) for line in list(self.lines) if line.startswith("{")]

    def plain_lines(self) -> list[str]:
        """The stderr lines that are not log lines (a command's one-line error)."""
        return [line for line in list(self.lines) if line.strip() and not line.startswith("{")]

    def logged(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("event") == event]

    def wait_logged(self, event: str, *, count: int = 1, timeout: float = 30) -> None:
        wait_until(lambda: len(self.logged(event)) >= count or self.proc.poll() is not None,
                   timeout=timeout, what=f"log line {event!r} x{count}; last lines:\n"
                   + "\n".join(self.lines[-8:]))
        if len(self.logged(event)) < count:
            raise AssertionError(f"worker exited {self.proc.returncode} before logging "
                                 f"{event!r}:\n" + "\n".join(self.lines[-20:]))

    def wait(self, seconds: float) -> None:
        """Let the worker run for up to `seconds` (less if it exits first)."""
        with suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=seconds)

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        """Wait for the exit; (exit code, stdout)."""
        # Not communicate(): it would read stderr too, racing the reader thread for lines.
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self.proc.wait(timeout=timeout)
        if self._reader:
            self._reader.join(timeout=10)
        self.proc.stdout.close()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return self.proc.returncode, out


def run_worker(*args: str, timeout: float = 120, **env: str) -> tuple[int, str, Worker]:
    """Run a worker to its end: (exit code, stdout, the worker with its log lines)."""
    worker = Worker.start(*args, **env)
    code, out = worker.finish(timeout)
    return code, out, worker


def worker_sessions() -> list[int]:
    """Backend pids of the worker role's sessions."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute("select pid from pg_stat_activity where usename = %s and datname = %s",
                       (WORKER_ROLE, connection.settings_dict["NAME"]))
        return [r[0] for r in cursor.fetchall()]


def terminate_worker_sessions() -> int:
    """pg_terminate_backend on every session of the worker role; how many were ended."""
    ended = 0
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        for pid in worker_sessions():
            cursor.execute("select pg_terminate_backend(%s)", (pid,))
            row = cursor.fetchone()
            ended += bool(row and row[0])
    return ended


def terminate_worker_waiting_on_a_lock(ended: set[int]) -> bool:
    """Terminate a worker session that waits on a lock, other than those in `ended` (a
    terminated backend shows until it has exited); True when one was, its pid added."""
    with connection.cursor() as cursor:
        cursor.execute("reset role")
        cursor.execute(
            "select pid from pg_stat_activity where usename = %s and datname = %s"
            " and wait_event_type = 'Lock' and pid <> all(%s)",
            (WORKER_ROLE, connection.settings_dict["NAME"], list(ended)))
        row = cursor.fetchone()
        if row is None:
            return False
        cursor.execute("select pg_terminate_backend(%s)", (row[0],))
        ended.add(row[0])
        return True


def worker_sessions_waiting_on_a_lock() -> int:
    """How many of the worker role's sessions on the test database wait on a lock."""
    return int(scalar("select count(*) from pg_stat_activity where usename = %s and datname = %s"
                      " and wait_event_type = 'Lock'",
                      (WORKER_ROLE, connection.settings_dict["NAME"])))


@contextmanager
def cycles_start_together(workers: int) -> Iterator[None]:
    """A start barrier for the worker processes started inside the block: each cycle blocks on
    its first write (the run history, held here in SHARE mode) until all `workers` wait there;
    then the lock goes and they start together, instead of one process start-up apart."""
    with psycopg.connect(test_database_url()) as holder:
        holder.execute("lock table profile.document_expiry_reminder_runs in share mode")
        yield
        wait_until(lambda: worker_sessions_waiting_on_a_lock() >= workers, timeout=120,
                   what=f"{workers} workers at the start barrier")
        holder.rollback()


def all_running_at_once(run_ids: list[str]) -> bool:
    """Whether the runs `run_ids` (from their "cycle completed" lines) were all running at one
    instant: the last of them started before the first of them finished (the run history's
    database clock)."""
    return bool(scalar(
        "select max(started_at) < min(finished_at) and count(*) = %s"
        " from profile.document_expiry_reminder_runs where run_id = any(%s::uuid[])",
        (len(run_ids), run_ids)))


def iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")
