"""What every benchmark shares: its database (created, dropped, migrated), the benchmark's named
SQL, the level start of a timed phase and what it wrote, the brokers, the logs' directory,
and the report (table cells, JSON, the host's description, the command line's common parts).

The data sets are bench/dataset.py's; the worker's commands as subprocesses, bench/worker.py's.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import time as clock_time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from core.queries import load

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
BENCH_SQL = Path(__file__).parent / "sql" / "bench.sql"
SERVER_URL = "postgres://postgres@127.0.0.1:5432"
Log = Callable[[str], object]  # where a benchmark says what it is doing (print, or nothing)
# The relay benchmarks' database (BENCH_DATABASE_URL overrides it), created afresh each run.
RELAY_DATABASE_URL = f"{SERVER_URL}/pin_profile_relay_bench"


def bench_query(name: str) -> str:
    """The benchmark's named statement `name` (bench/sql/bench.sql)."""
    return load(BENCH_SQL)[name]


def yesterday() -> datetime:
    """Yesterday's UTC midnight: the next day's cycle is then never in the future."""
    today = datetime.now(UTC).date()
    return datetime.combine(today - timedelta(days=1), clock_time(0), tzinfo=UTC)


# --- the database -----------------------------------------------------------------------------

def connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, options="-c search_path=profile,public")


def one(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any] | None = None
        ) -> tuple[Any, ...]:
    """The one row of `sql`; raises if there is none."""
    row = conn.execute(sql, params).fetchone()
    if row is None:
        raise RuntimeError(f"no row from {sql[:60]!r}")
    return tuple(row)


def _server_and_name(url: str) -> tuple[str, str]:
    """(the URL of the server's `postgres` database, the database's name) of a database URL."""
    parts = urlsplit(url)
    return parts._replace(path="/postgres").geturl(), parts.path.lstrip("/")


def drop_database(url: str) -> None:
    admin, name = _server_and_name(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')


def fresh_database(url: str) -> None:
    """Drop the database of `url` if it exists, and create it empty."""
    drop_database(url)
    admin, name = _server_and_name(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')


def ensure_database(url: str) -> None:
    """Create the database of `url` if it is missing; keep it as it is otherwise."""
    admin, name = _server_and_name(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone() is None:
            conn.execute(f'create database "{name}"')


def setup_django(url: str, *, fresh: bool = True) -> None:
    """This process on Django with the database at `url` (created afresh unless not `fresh`:
    then kept if it exists), migrated."""
    if fresh:
        fresh_database(url)
    else:
        ensure_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pin_profile.settings")
    os.environ.setdefault("LOG_LEVEL", "ERROR")
    sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def database_url(using: str = "default") -> str:
    """The URL of Django's database `using`, for a process of its own."""
    from django.db import connections

    settings = connections[using].settings_dict
    return (f"postgres://{settings['USER']}@{settings['HOST'] or '127.0.0.1'}:"
            f"{settings['PORT'] or 5432}/{settings['NAME']}")


# --- a timed phase ----------------------------------------------------------------------------

def quiet(conn: psycopg.Connection[Any], *, analyze: bool = True) -> None:
    """Start each timed phase level: statistics fresh (unless not `analyze`: the stale phase),
    dirty pages flushed."""
    if analyze:
        conn.execute("vacuum analyze document_expiry_reminders, outbox_messages")
    conn.execute("checkpoint")


@dataclass(slots=True)
class Activity:
    """WAL written and checkpoints taken while a phase ran (server-wide: other databases'
    checkpoints count too, as they cost this phase full-page writes)."""

    wal_lsn: str
    checkpoints: int

    @classmethod
    def now(cls, conn: psycopg.Connection[Any]) -> "Activity":
        row = one(conn, "select pg_current_wal_lsn()::text,"
                        " checkpoints_timed + checkpoints_req from pg_stat_bgwriter")
        return cls(str(row[0]), int(row[1]))

    def since(self, conn: psycopg.Connection[Any]) -> tuple[float, int]:
        """(WAL MB written, checkpoints taken) since `now`."""
        row = one(conn, "select pg_wal_lsn_diff(pg_current_wal_lsn(), %(lsn)s::pg_lsn),"
                        " checkpoints_timed + checkpoints_req from pg_stat_bgwriter",
                  {"lsn": self.wal_lsn})
        return float(row[0]) / 2**20, int(row[1]) - self.checkpoints


@contextmanager
def log_dir(keep: Path | None, prefix: str = "bench-") -> Iterator[Path]:
    """Where the commands' logs go: `keep` if given, else a directory removed afterwards."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as path:
        yield Path(path)


# --- Kafka ------------------------------------------------------------------------------------

@contextmanager
def brokers(bootstrap: str | None, topics: dict[str, int] | None = None) -> Iterator[str]:
    """The brokers' bootstrap: `bootstrap` if given, else a fresh mock cluster of 3 brokers (in
    this process; other processes reach it over loopback) with `topics` (name: partitions)
    created."""
    if bootstrap is not None:
        yield bootstrap
        return
    from devtools.mock_kafka import MockKafkaCluster

    with MockKafkaCluster(3) as cluster:
        for topic, partitions in (topics or {}).items():
            cluster.create_topic(topic, partitions)
        yield cluster.bootstrap_servers


def quiet_kafka_logger() -> Any:
    """A logger for librdkafka that says errors only."""
    import logging

    logger = logging.getLogger("bench.kafka")
    logger.setLevel(logging.ERROR)
    return logger


def warm_up(bootstrap: str, topic: str) -> None:
    """Create the topic and load its metadata, so neither side pays for auto-creation."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "logger": quiet_kafka_logger()})
    producer.produce(topic, b"warm-up")
    if producer.flush(30):
        raise RuntimeError(f"could not warm up {topic} on {bootstrap}")


# --- the report -------------------------------------------------------------------------------

def fmt(value: Any, spec: str = "") -> str:
    """A table cell: "-" for nothing, yes or no for a flag, else `value` formatted by `spec`."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return format(value, spec)


def load_average() -> str:
    return " ".join(f"{n:.1f}" for n in os.getloadavg())


def host(server_version: str | None = None) -> dict[str, Any]:
    """The machine a result was measured on, for its JSON."""
    described: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    if server_version is not None:
        described["postgres"] = server_version
    return {**described, "load_at_end": os.getloadavg()}


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def parser_for(doc: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """A benchmark's argument parser, described by its module docstring's first paragraph."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None, **kwargs)


def positive(raw: str) -> int:
    """An argument type: a whole number of at least 1."""
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {raw!r}")
    return value


def add_server_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default=os.environ.get("BENCH_SERVER_URL", SERVER_URL),
                        help="superuser URL of the server, without database")
