"""Rolling-upgrade test support: a database of its own on the test server, commands of either
release as subprocesses on it, a document writer, and a sampler of lock waits."""

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from django.db import connection

from tests.support.releases import ROOT, Install


def server_url(database: str, role: str | None = None) -> str:
    settings = connection.settings_dict
    return (f"postgres://{role or settings['USER']}@{settings['HOST'] or '127.0.0.1'}:"
            f"{settings['PORT'] or 5432}/{database}")


def connect(database: str) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit owner's session on `database`, its tables reached as the service's are."""
    return psycopg.connect(server_url(database), autocommit=True,
                           options="-c search_path=profile,public")


@contextmanager
def own_database() -> Iterator[str]:
    """A fresh empty database on the test server (its name), dropped at the end."""
    name = f"upgrade_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url(connection.settings_dict["NAME"]), autocommit=True) as admin:
        admin.execute(f'create database "{name}"')
        try:
            yield name
        finally:
            admin.execute(f'drop database if exists "{name}" with (force)')


@dataclass(frozen=True)
class Side:
    """One release's commands on `database`: the old release's tree and Python, or this one's."""

    database: str
    install: Install | None  # None: this checkout

    def argv(self, *args: str) -> list[str]:
        python = self.install.manage_py() if self.install else [sys.executable, str(ROOT / "manage.py")]
        return [*python, *args]

    @property
    def cwd(self) -> Path:
        return self.install.tree if self.install else ROOT

    def env(self, role: str | None, extra: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("REMINDER_", "OUTBOX_", "KAFKA_")) and k != "PYTHONPATH"}
        env.update(DATABASE_URL=server_url(self.database, role), LOG_FORMAT="json",
                   PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def run(self, *args: str, role: str | None = None, extra: Mapping[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The command to its end, as `role` (default: the schema's owner)."""
        return subprocess.run(self.argv(*args), env=self.env(role, extra or {}), text=True,
                              capture_output=True, timeout=timeout, check=False, cwd=self.cwd)

    def start(self, log: Path, *args: str, role: str | None = None,
              extra: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """The command in the background, its stderr (JSON lines) to `log`."""
        with log.open("w") as stderr:
            return subprocess.Popen(self.argv(*args), env=self.env(role, extra or {}), text=True,
                                    stdout=subprocess.DEVNULL, stderr=stderr, cwd=self.cwd)


def log_lines(log: Path) -> list[dict[str, Any]]:
    lines = []
    for line in log.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return lines


# The profile service's row, as it writes one (the table is not ours: no factory of this
# checkout, whose row type may differ from the previous release's).
DOCUMENT = ("insert into person_documents (id, owner_user_id, person_id, type, number_mask,"
            " expires_at, status, payload_cipher, created_at, updated_at)"
            " values (%s, %s, %s, 'Passport', %s, %s, 'Active', 'cipher', now(), now())")


def unpublished(database: str) -> int:
    """Outbox rows the relay has not yet published."""
    with connect(database) as conn:
        row = conn.execute("select count(*) from outbox_messages m"
                           " where outbox_published_at(m) is null").fetchone()
    return int(row[0]) if row else -1


class DocumentWriter(threading.Thread):
    """Adds `per_batch` documents of new owners every `every` seconds, as the profile service
    would, expiring from `first_expiry` on over 40 days, until stopped or `most` are written
    (a slow machine gets no more work than a fast one)."""

    def __init__(self, database: str, first_expiry: datetime, *, per_batch: int = 5,
                 every: float = 0.1, most: int = 2000) -> None:
        super().__init__(daemon=True)
        self.database, self.first_expiry = database, first_expiry
        self.per_batch, self.every, self.most = per_batch, every, most
        self.written = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            with connect(self.database) as conn:
                while (not self._stop_event.wait(self.every)  # pacing the load, not a wait
                       and self.written < self.most):
                    rows = [(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), f"45 ** ****{n:02d}",
                             self.first_expiry + timedelta(days=(self.written + n) % 40))
                            for n in range(self.per_batch)]
                    with conn.cursor() as cur:
                        cur.executemany(DOCUMENT, rows)
                    self.written += len(rows)
        except BaseException as error:  # reported by the test, in stop()
            self.error = error

    def stop(self) -> int:
        self._stop_event.set()
        self.join(timeout=30)
        if self.error is not None:
            raise AssertionError(f"the document writer failed: {self.error!r}")
        return self.written


@dataclass
class LockWaits:
    """Every lock wait seen in the database: (pid, role, wait start) -> longest seen (s)."""

    waits: dict[tuple[int, str, datetime], float] = field(default_factory=dict)
    samples: int = 0

    def longest(self, roles: set[str]) -> float:
        return max((s for (_, role, _), s in self.waits.items() if role in roles), default=0.0)

    def by_role(self) -> dict[str, tuple[int, float]]:
        out: dict[str, tuple[int, float]] = {}
        for (_, role, _), seconds in self.waits.items():
            count, longest = out.get(role, (0, 0.0))
            out[role] = (count + 1, max(longest, seconds))
        return out


class LockSampler(threading.Thread):
    """Samples pg_locks (waitstart: PostgreSQL 14+) every `every` seconds until stopped."""

    QUERY = ("select l.pid, a.usename, l.waitstart, extract(epoch from clock_timestamp() - l.waitstart)"
             " from pg_locks l join pg_stat_activity a using (pid)"
             " where not l.granted and l.waitstart is not null and a.datname = %s")

    def __init__(self, database: str, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.database, self.every = database, every
        self.found = LockWaits()
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            with connect(self.database) as conn:
                while not self._stop_event.wait(self.every):  # the sampling period
                    for pid, role, start, seconds in conn.execute(self.QUERY, [self.database]):
                        key = (int(pid), str(role), start)
                        self.found.waits[key] = max(self.found.waits.get(key, 0.0), float(seconds))
                    self.found.samples += 1
        except BaseException as error:  # reported by the test, in stop()
            self.error = error

    def stop(self) -> LockWaits:
        self._stop_event.set()
        self.join(timeout=30)
        if self.error is not None:
            raise AssertionError(f"the lock sampler failed: {self.error!r}")
        return self.found


def database_days(database: str, days_ago: range) -> list[datetime]:
    """UTC midnights `days_ago` before today on the database's clock (the run history's)."""
    with connect(database) as conn:
        row = conn.execute("select date_trunc('day', now() at time zone 'UTC')").fetchone()
    assert row is not None
    today = row[0].replace(tzinfo=UTC)
    return [today - timedelta(days=n) for n in days_ago]
