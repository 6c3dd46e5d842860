"""Throwaway PostgreSQL clusters from Debian's binaries, for what an operator does to a database
over the years: dump and restore it elsewhere, move it by logical replication, upgrade it."""

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from tests.support.pg_binaries import as_postgres, bindir
from tests.support.processes import manage_py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """One cluster in a directory of its own, on a loopback port, trust authentication."""

    def __init__(self, name: str, *, settings: Sequence[str] = ()) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"pin-{name}-", dir="/tmp"))
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        self.data = self.dir / "data"
        self.port = free_port()
        self.settings = list(settings)

    def run(self, tool: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*as_postgres(), str(bindir() / tool), *args], text=True,
                              capture_output=True, check=True, timeout=300, cwd=self.dir,
                              **kwargs)

    def init(self, *, xid_epoch: int = 0) -> "Cluster":
        """initdb; with `xid_epoch`, its transaction ids start that many 2**32 higher (as a
        cluster that has run for years has them)."""
        self.run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust")
        if xid_epoch:
            self.run("pg_resetwal", "-e", str(xid_epoch), "-D", str(self.data))
        return self

    def start(self) -> "Cluster":
        # checkpoint_completion_target=0: a requested checkpoint (pg_basebackup's) ends at once
        # instead of being spread over minutes of an idle test
        options = ["-c listen_addresses=127.0.0.1", f"-c port={self.port}",
                   f"-c unix_socket_directories={self.dir}", "-c fsync=off",
                   "-c checkpoint_completion_target=0",
                   *(f"-c {s}" for s in self.settings)]
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w",
                 "-o", " ".join(options), "start")
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres", role: str = "postgres") -> str:
        return f"postgres://{role}@127.0.0.1:{self.port}/{database}"

    def sql(self, database: str, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One statement in autocommit; its rows (none for a statement without)."""
        with psycopg.connect(self.url(database), autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def system_identifier(self) -> int:
        return int(self.sql("postgres", "select system_identifier from pg_control_system()")[0][0])


@contextmanager
def clusters(*names: str, settings: Sequence[str] = ()) -> Iterator[list[Cluster]]:
    """Clusters made for the block (not yet initialised), removed after it."""
    made = [Cluster(name, settings=settings) for name in names]
    try:
        yield made
    finally:
        for cluster in made:
            cluster.remove()


def manage(url: str, *args: str, env: dict[str, str] | None = None,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    """`manage.py ARGS` on the dev settings against the database at `url`."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("REMINDER_", "OUTBOX_", "KAFKA_"))}
    full.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="pin_profile.settings_dev",
                LOG_FORMAT="json", PYTHONUNBUFFERED="1", **(env or {}))
    done = subprocess.run([*manage_py(), *args], env=full, text=True, capture_output=True,
                          timeout=300, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} exited {done.returncode}:\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


def new_database(cluster: Cluster, name: str, *, owners: int) -> str:
    """A database as production has it: the schema, the documents table, the roles, and
    `owners` owners' demo documents; its URL (as the table owner)."""
    cluster.sql("postgres", f"create database {name}")
    url = cluster.url(name)
    manage(url, "migrate", "-v", "0")
    manage(url, "create_dev_person_documents")
    manage(url, "apply_db_roles")
    manage(url, "seed_demo_documents", "--owners", str(owners))
    return url


def start_manage(url: str, *args: str, log: Path,
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`manage.py ARGS` as a process left running (a `--loop`), its stderr into `log`."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("REMINDER_", "OUTBOX_", "KAFKA_"))}
    full.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="pin_profile.settings_dev",
                LOG_FORMAT="json", PYTHONUNBUFFERED="1", **(env or {}))
    with log.open("w") as stderr:
        return subprocess.Popen([*manage_py(), *args], env=full, text=True,
                                stdout=subprocess.DEVNULL, stderr=stderr)
