"""CPU per "reminder queued" line: the cycle's per-reminder work, from the claim
statement's rows to the bytes written, on both of the worker's threads.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python -m bench.log_lines_bench

The rows come from PostgreSQL (`notified_rows` in bench/sql/bench.sql: the shape of the
claim's last select, fetched as the claim fetches them), so loading them counts too. Each
batch goes through the cycle's own accounting (`Cycle._account`), and the records through
the worker's handler (`QueuedStderrHandler`, JSON) into a file opened as the worker's stderr
is under a supervisor (line-buffered, written through). Prints CPU microseconds per line: the
process (both threads), the caller's thread alone, and with the level at WARNING (no lines).
CPU time, not wall time: on a shared machine it moves far less than the clock.
"""

import argparse
import io
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any


def _fetch_batches(url: str, batches: int, batch: int
                   ) -> tuple[list[list[tuple[Any, ...]]], float]:
    """The batches' rows, and the CPU seconds this thread spent reading them."""
    import psycopg

    from bench.harness import bench_query

    out: list[list[tuple[Any, ...]]] = []
    cpu = 0.0
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(batches):
            cur = conn.cursor(binary=True)  # as store.claim_batch
            cur.execute(bench_query("notified_rows"), {"rows": batch})
            started = time.thread_time()
            out.append(cur.fetchall())
            cpu += time.thread_time() - started
    return out, cpu


def _measure(batches: Sequence[list[tuple[Any, ...]]], level: int) -> tuple[float, float, int]:
    """(process CPU s, caller-thread CPU s, lines written) for every batch through the cycle's
    accounting and the worker's log handler."""
    from core.logs import QueuedStderrHandler
    from reminders import cycle, ledger, store
    from reminders.config import ReminderSettings

    with tempfile.TemporaryFile() as raw:
        stderr, sys.stderr = sys.stderr, io.TextIOWrapper(
            raw, encoding="utf-8", line_buffering=True, write_through=True)
        handler = QueuedStderrHandler(fmt="json", backlog=8)
        sys.stderr.flush()
        logger = cycle.logger
        saved = logger.handlers, logger.level, logger.propagate
        logger.handlers, logger.propagate = [handler], False
        logger.setLevel(level)
        try:
            runner = cycle.Cycle(ReminderSettings())
            writes = ledger.Writes(runner.scope)
            process, thread = time.process_time(), time.thread_time()
            for rows in batches:
                runner._account(writes, store.claim_from_rows(rows))
            handler.flush()
            process, thread = time.process_time() - process, time.thread_time() - thread
        finally:
            logger.handlers, logger.level, logger.propagate = saved
            handler.close()
            sys.stderr.flush()
            sys.stderr.detach()
            sys.stderr = stderr
        raw.seek(0)
        lines = sum(1 for _ in raw)
    return process, thread, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=500, help="notified rows per batch")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the least CPU counts")
    args = parser.parse_args(argv)
    url = os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pin_profile.settings")
    import django

    django.setup()
    batches, loading = _fetch_batches(url, args.batches, args.batch)
    total = args.batches * args.batch
    print(f"reading the claim's rows: {loading / total * 1e6:.2f} us CPU per reminder")
    for name, level in (("INFO (a line per reminder)", logging.INFO),
                        ("WARNING (no lines)", logging.WARNING)):
        runs = [_measure(batches, level) for _ in range(args.repeat)]
        process, thread, lines = min(runs)  # the least disturbed run
        print(f"{name}: {lines:,} lines; CPU per reminder {process / total * 1e6:.2f} us "
              f"(caller's thread {thread / total * 1e6:.2f} us, writer "
              f"{(process - thread) / total * 1e6:.2f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
