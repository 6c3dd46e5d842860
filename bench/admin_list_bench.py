"""How fast the admin's list pages load with a production-sized ledger.

Builds (once) a throwaway database with ROWS ledger markers (default 3,000,000) written by
INSERT ... SELECT generate_series into the migrated table (every index in place), then
renders each admin page through Django's test client as a logged-in superuser and prints
the median and slowest time of several loads, with the SQL each load ran.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pin_profile_admin_bench \
        .venv/bin/python bench/admin_list_bench.py [--rows 3000000] [--rebuild] [--loads 7]

The database named by DATABASE_URL is created if missing and rebuilt with --rebuild or when
its row count differs. Not a test: it prints numbers.
"""

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

# Run as a file too (python bench/admin_list_bench.py): the project's root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from core.queries import QueryFile

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pin_profile_admin_bench"
DAYS = 120  # markers live about [expiry - 30 days, expiry + 90 days]
LEDGER_SQL = QueryFile(Path(__file__).parent / "sql" / "admin_ledger.sql")


def fill_ledger(rows: int) -> float:
    """ROWS markers: 4 thresholds per document, 3 documents per owner, written day by day; a
    week of outbox beside them, as the relay leaves it (bench/sql/admin_ledger.sql); seconds."""
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("truncate document_expiry_reminders, outbox_messages")
        cursor.execute(LEDGER_SQL["fill_ledger_markers"], {"rows": rows, "days": DAYS})
        cursor.execute(LEDGER_SQL["fill_outbox_week"], {"messages": max(rows // 40, 1000)})
        cursor.execute(LEDGER_SQL["outbox_as_relayed"])
    with connection.cursor() as cursor:
        cursor.execute("vacuum analyze document_expiry_reminders")
        cursor.execute("vacuum analyze outbox_messages")
    return time.perf_counter() - started


def ledger_rows() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("select count(*) from document_expiry_reminders")
        return int(cursor.fetchone()[0])


def pages() -> list[tuple[str, str]]:
    """(label, URL) of the pages to time; ids are taken from the data."""
    from django.urls import reverse

    from reminders.models import DocumentExpiryReminder

    ledger = reverse("admin:reminders_documentexpiryreminder_changelist")
    outbox = reverse("admin:outbox_outboxmessage_changelist")
    sample = DocumentExpiryReminder.objects.order_by("-reminded_at").first()
    if sample is None:
        raise SystemExit("the ledger is empty")
    today = sample.reminded_at.date()
    return [
        ("ledger list, newest first", ledger),
        ("ledger list, page 50", f"{ledger}?p=50"),
        ("ledger, threshold = 7", f"{ledger}?threshold_days=7"),
        ("ledger, type = Visa", f"{ledger}?type=Visa"),
        ("ledger, notified = yes", f"{ledger}?notified__exact=1"),
        ("ledger, expires within 7 days", f"{ledger}?expires_at__gte={today}"
                                           f"&expires_at__lt={today + timedelta(days=8)}"),
        ("ledger, expired 31-90 days ago", f"{ledger}?expires_at__gte={today - timedelta(days=90)}"
                                            f"&expires_at__lt={today - timedelta(days=30)}"),
        ("ledger, type absent (worst case)", f"{ledger}?type=Snils"),
        ("ledger, threshold absent (worst)", f"{ledger}?threshold_days=14"),
        ("ledger, date hierarchy month", f"{ledger}?reminded_at__year={today.year}"
                                          f"&reminded_at__month={today.month}"),
        ("ledger, month + threshold = 0", f"{ledger}?reminded_at__year={today.year}"
                                          f"&reminded_at__month={today.month}&threshold_days=0"),
        ("ledger, search owner id", f"{ledger}?q={sample.owner_user_id}"),
        ("ledger, search document id", f"{ledger}?q={sample.document_id}"),
        ("ledger, marker detail", reverse("admin:reminders_documentexpiryreminder_change",
                                          args=[sample.pk])),
        ("overview", reverse("admin:reminders_overview")),
        ("outbox list", outbox),
        ("outbox, parked", f"{outbox}?delivery=parked"),
        ("run history", reverse("admin:reminders_reminderrun_changelist")),
    ]


def time_pages(loads: int) -> list[dict[str, Any]]:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user, _ = User.objects.get_or_create(username="bench", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    results = []
    for label, url in pages():
        # over HTTPS, as production serves it (its settings redirect plain HTTP)
        client.get(url, secure=True)  # warm up, as an operator's second click would
        times: list[float] = []
        queries: list[dict[str, str]] = []
        for _ in range(loads):
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                response = client.get(url, secure=True)
                times.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise SystemExit(f"{label}: HTTP {response.status_code} for {url}")
            queries = captured.captured_queries
        slowest = max(queries, key=lambda q: float(q["time"]))
        results.append({"page": label, "median_ms": statistics.median(times), "max_ms": max(times),
                        "queries": len(queries), "slowest_sql_ms": float(slowest["time"]) * 1000,
                        "slowest_sql": slowest["sql"]})
    return results


def _print_table(results: list[dict[str, Any]], rows: int, loads: int, *, show_sql: bool) -> None:
    print(f"\nadmin page load times, {rows:,} ledger rows, {loads} loads each (server side, "
          "Django test client)")
    print(f"{'page':<34} {'median ms':>10} {'max ms':>8} {'queries':>8} {'slowest SQL ms':>15}")
    for r in results:
        print(f"{r['page']:<34} {r['median_ms']:>10.1f} {r['max_ms']:>8.1f} {r['queries']:>8}"
              f" {r['slowest_sql_ms']:>15.1f}")
        if show_sql:
            print(f"    {r['slowest_sql'][:400]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=3_000_000, help="ledger markers (default 3,000,000)")
    parser.add_argument("--loads", type=int, default=7, help="timed loads per page (default 7)")
    parser.add_argument("--rebuild", action="store_true", help="refill the ledger even if its size matches")
    parser.add_argument("--show-sql", action="store_true", help="print each page's slowest SQL statement")
    args = parser.parse_args()
    harness.setup_django(os.environ.get("DATABASE_URL", DEFAULT_URL), fresh=False)
    from django.test.utils import setup_test_environment

    from core.db import apply_sql_file
    from devtools.demo_data import PERSON_DOCUMENTS_SQL

    setup_test_environment()  # lets the test client through ALLOWED_HOSTS
    apply_sql_file(PERSON_DOCUMENTS_SQL)  # the overview's backlog census reads it (empty here)
    rows = ledger_rows()
    if args.rebuild or rows != args.rows:
        print(f"filling the ledger with {args.rows:,} markers ...", flush=True)
        print(f"filled in {fill_ledger(args.rows):.1f} s", flush=True)
        rows = ledger_rows()
    _print_table(time_pages(args.loads), rows, args.loads, show_sql=args.show_sql)
    return 0


if __name__ == "__main__":
    sys.exit(main())
