"""Benchmark data sets, built with COPY into a fresh database.

Two shapes, documents spread over about N/3 owners (each document picks a random owner, so an
owner's documents are scattered over the heap as they are in a table that grew for years):
- `backlog`: every document Active and inside the scan window, expiring from 90 days past
  to 30 days ahead of as-of (the first run, or the day after a long outage);
- `steady`: expiry dates over 10 years around as-of, 15% without expiry, 7% archived, 5%
  soft-deleted; about 3% fall in the window (the daily run at scale).

`DatasetConfig` names a data set and its database; `prepare` builds it there (migrations, the
documents table, the roles, the rows by COPY) or keeps it if it holds this very data set.
"""

import argparse
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock_time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench import harness, worker
from core.roles import ROLES_SQL
from devtools.demo_data import COPY_COLUMNS, NO_EXPIRY_TYPES, PERSON_DOCUMENTS_SQL
from reminders.events import DOCUMENT_TYPES

SHAPES = ("backlog", "steady")
DEFAULT_SIZES = {"backlog": 1_000_000, "steady": 10_000_000}
DOCUMENTS_PER_OWNER = 3
CHUNK_ROWS = 20_000

# Owner and person ids come from their index through a bijection of 128-bit integers, so they
# look random, are unique, and need no table in memory.
_MIX = 0x9E3779B97F4A7C15F39CC0605CEDC835
_MASK = (1 << 128) - 1


@dataclass(frozen=True, slots=True)
class Shape:
    """Where expiry dates fall (days from as-of), and the share of documents outside the scan."""

    name: str
    first_day: int
    last_day: int
    no_expiry: float
    archived: float
    deleted: float


BACKLOG = Shape("backlog", first_day=-90, last_day=30, no_expiry=0.0, archived=0.0, deleted=0.0)
STEADY = Shape("steady", first_day=-1826, last_day=1826, no_expiry=0.15, archived=0.07,
               deleted=0.05)


def shape_named(name: str) -> Shape:
    return {"backlog": BACKLOG, "steady": STEADY}[name]


def _hex_id(index: int, salt: int) -> str:
    return f"{((index * _MIX) ^ salt) & _MASK:032x}"


def document_rows(shape: Shape, n: int, as_of_date: date, seed: int,
                  documents_per_owner: int = DOCUMENTS_PER_OWNER) -> Iterator[str]:
    """The COPY text lines (COPY_COLUMNS order) of `n` documents, deterministic for `seed`.
    Owners are drawn at random among n / documents_per_owner; with 1, owner i has document i
    (one document each, as a partner's import of one document an investor)."""
    rng = random.Random(seed)
    owners = max(1, n // documents_per_owner)
    draw = (lambda i: i) if documents_per_owner == 1 else (lambda i: rng.randrange(owners))
    owner_salt, person_salt = rng.getrandbits(128), rng.getrandbits(128)
    days = {
        offset: (as_of_date + timedelta(days=offset)).isoformat()
        for offset in range(min(shape.first_day, -3000), shape.last_day + 1)
    }
    types, no_expiry_types = DOCUMENT_TYPES, NO_EXPIRY_TYPES
    for index in range(n):
        owner = draw(index)
        seconds = rng.randrange(86_400)
        clock = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}+00"
        if shape.no_expiry and rng.random() < shape.no_expiry:
            kind, expires = rng.choice(no_expiry_types), r"\N"
        else:
            kind = rng.choice(types)
            expires = f"{days[rng.randint(shape.first_day, shape.last_day)]} {clock}"
        status = "Archived" if shape.archived and rng.random() < shape.archived else "Active"
        deleted = (f"{days[-rng.randint(1, 300)]} {clock}"
                   if shape.deleted and rng.random() < shape.deleted else r"\N")
        mask = f"{rng.randint(10, 99)} ** ****{rng.randint(10, 99)}" if rng.random() < 0.9 else r"\N"
        created = f"{days[-rng.randint(30, 3000)]} {clock}"
        yield (
            f"{rng.getrandbits(128):032x}\t{_hex_id(owner, owner_salt)}\t"
            f"{_hex_id(owner, person_salt)}\t{kind}\t{mask}\t{expires}\t{status}\t{deleted}\t"
            f"\\\\x{rng.getrandbits(384):096x}\t{created}\t{created}\n"
        )


def copy_documents(conn: psycopg.Connection[Any], lines: Iterator[str], *,
                   analyze: bool = True) -> int:
    """Empty person_documents and COPY `lines` into it, frozen, with its indexes rebuilt after:
    building an index once is much faster than growing it row by row. Without `analyze`, the
    table has no column statistics (building the indexes counted its rows), as right after a
    bulk load that autovacuum has not analyzed yet."""
    count = 0
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("truncate person_documents")
        cur.execute("alter table person_documents drop constraint if exists person_documents_pkey")
        cur.execute("drop index if exists ix_person_documents_expires_at")
        cur.execute("drop index if exists ix_person_documents_owner_user_id")
        with cur.copy(
            f"copy person_documents ({', '.join(COPY_COLUMNS)}) from stdin with (freeze)"
        ) as copy:
            chunk: list[str] = []
            for line in lines:
                chunk.append(line)
                if len(chunk) == CHUNK_ROWS:
                    copy.write("".join(chunk))
                    count += len(chunk)
                    chunk = []
            copy.write("".join(chunk))
            count += len(chunk)
        cur.execute("set local maintenance_work_mem = '512MB'")
        cur.execute("alter table person_documents add primary key (id)")
        cur.execute(PERSON_DOCUMENTS_SQL.read_text(encoding="utf-8").encode())
    if analyze:
        conn.execute("vacuum analyze person_documents")
    return count


# --- the data set in its database -------------------------------------------------------------

@dataclass(slots=True)
class DatasetConfig:
    """A data set (its shape, size, seed, as-of, owners) and the database that holds it."""

    shape: str
    documents: int
    server_url: str = harness.SERVER_URL
    database: str = ""  # default: pin_profile_bench_<shape>
    seed: int = 6
    as_of: datetime = field(default_factory=harness.yesterday)
    reuse: bool = False  # keep the database if it holds this very data set
    documents_per_owner: int = DOCUMENTS_PER_OWNER
    # loaded with no ANALYZE of any table (and autovacuum off person_documents), as after a
    # bulk import: never reused (an earlier run analyzed it)
    stale_statistics: bool = False

    def __post_init__(self) -> None:
        self.database = self.database or f"pin_profile_bench_{self.shape}"

    def url(self, database: str | None = None, user: str | None = None) -> str:
        parts = urlsplit(self.server_url)
        netloc = parts.netloc
        if user is not None:
            netloc = f"{user}@{netloc.rsplit('@', 1)[-1]}"
        return urlunsplit((parts.scheme, netloc, f"/{database or self.database}", "", ""))

    def tag(self) -> str:
        """What the data set is, as its database records it (public.bench_dataset)."""
        per_owner = ("" if self.documents_per_owner == DOCUMENTS_PER_OWNER
                     else f":{self.documents_per_owner}-per-owner")
        return (f"{self.shape}:{self.documents}:{self.seed}:{self.as_of.date().isoformat()}"
                f"{per_owner}")


def existing_tag(config: DatasetConfig) -> str | None:
    """The tag of the data set the database holds; None without database or data set."""
    try:
        with harness.connect(config.url()) as conn:
            row = conn.execute("select tag from public.bench_dataset").fetchone()
    except psycopg.Error:
        return None
    return None if row is None else str(row[0])


def build_database(config: DatasetConfig) -> tuple[float, int]:
    """A fresh database: migrations, the documents table, the roles, then the data by COPY;
    (seconds, documents copied)."""
    started = time.perf_counter()
    harness.fresh_database(config.url())
    subprocess.run([sys.executable, str(worker.MANAGE_PY), "migrate", "--noinput", "-v", "0"],
                   check=True, cwd=worker.ROOT,
                   env={**os.environ, "DATABASE_URL": config.url()})
    with harness.connect(config.url()) as conn:
        conn.execute(PERSON_DOCUMENTS_SQL.read_text(encoding="utf-8").encode())
        conn.execute(ROLES_SQL.read_text(encoding="utf-8").encode())
        rows = document_rows(shape_named(config.shape), config.documents, config.as_of.date(),
                             config.seed, config.documents_per_owner)
        if config.stale_statistics:
            # no analyze of it until the stale cycle is over, by the bench or by autovacuum
            conn.execute("alter table person_documents set (autovacuum_enabled = off)")
        copied = copy_documents(conn, rows, analyze=not config.stale_statistics)
        conn.execute("create table public.bench_dataset (tag text not null)")
        conn.execute("insert into public.bench_dataset values (%s)", (config.tag(),))
    return time.perf_counter() - started, copied


def drop_database(config: DatasetConfig) -> None:
    harness.drop_database(config.url())


def prepare(config: DatasetConfig, log: harness.Log) -> tuple[float, int] | None:
    """Build the data set in its database, or keep it (with `reuse`, if the database holds this
    very data set and it is not a stale-statistics run); (seconds, documents) if built."""
    if config.reuse and not config.stale_statistics and existing_tag(config) == config.tag():
        log(f"reusing {config.database} ({config.tag()})")
        return None
    log(f"building {config.database}: {config.shape}, {config.documents:,} documents ...")
    built = build_database(config)
    log(f"  built in {built[0]:.1f} s")
    return built


def add_arguments(parser: argparse.ArgumentParser, default_shape: str) -> None:
    """The data set's options: --shape, -n, --server, --database, --seed, --as-of, --reuse."""
    parser.add_argument("--shape", choices=SHAPES, default=default_shape)
    parser.add_argument("-n", "--documents", type=int,
                        help="documents in the data set (default: 1,000,000 backlog, "
                             "10,000,000 steady)")
    harness.add_server_argument(parser)
    parser.add_argument("--database", default="",
                        help="benchmark database, dropped and created (default "
                             "pin_profile_bench_<shape>)")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--as-of", type=date.fromisoformat,
                        help="the cold cycle's UTC date (default: yesterday; the next day's "
                             "cycle is today at midnight)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the database if it holds this very data set")


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """DatasetConfig's fields from the options of `add_arguments`."""
    return {"shape": args.shape, "documents": args.documents or DEFAULT_SIZES[args.shape],
            "server_url": args.server, "database": args.database, "seed": args.seed,
            "as_of": datetime.combine(args.as_of, clock_time(0), tzinfo=UTC) if args.as_of
            else harness.yesterday(), "reuse": args.reuse}
