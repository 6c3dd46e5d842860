"""Benchmark data sets (issue 6), built with COPY into a fresh database.

Two shapes, documents spread over about N/3 owners (each document picks a random owner, so an
owner's documents are scattered over the heap as they are in a table that grew for years):
- `backlog`: every document Active and inside the scan window, expiring from 90 days past
  to 30 days ahead of as-of (the first run, or the day after a long outage);
- `steady`: expiry dates over 10 years around as-of, 15% without expiry, 7% archived, 5%
  soft-deleted; about 3% fall in the window (the daily run at scale).
"""

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import psycopg

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
