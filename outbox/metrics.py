"""Outbox metrics: the backlog read from the table at scrape time, and the relay's counters.

The relay calls `record_published(n)`, `record_failed(n)` and `record_parked(n)` as delivery
reports come in; any process serving metrics can `register_outbox_gauges()` (the reminder
worker does, so the backlog stays visible while the relay is down).
"""

from pathlib import Path

import psycopg
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from reminders.queries import load
from reminders.scrape import DatabaseGauges
from reminders.store import raw_connection

QUERIES_FILE = Path(__file__).parent / "sql" / "metrics.sql"

UNPUBLISHED = "profile_outbox_unpublished_messages"
OLDEST_AGE = "profile_outbox_oldest_unpublished_age_seconds"
PARKED = "profile_outbox_parked_messages"
GAUGES = {
    UNPUBLISHED: "Outbox messages waiting for the relay (not published, not parked).",
    OLDEST_AGE: "Age in seconds of the oldest message waiting for the relay (0 when none): the lag.",
    PARKED: "Outbox messages the relay gave up on (parked_at set); they wait for a re-queue.",
}
GAUGE_REFRESH_S = 15.0

PUBLISHED_TOTAL = Counter(
    "profile_outbox_published_total", "Outbox messages the relay published (delivery confirmed)."
)
FAILED_TOTAL = Counter(
    "profile_outbox_failed_total", "Failed delivery attempts of outbox messages (retried or parked)."
)
PARKED_TOTAL = Counter(
    "profile_outbox_parked_total", "Outbox messages the relay parked after its last attempt."
)


def record_published(n: int = 1) -> None:
    """The relay confirmed delivery of `n` messages."""
    PUBLISHED_TOTAL.inc(n)


def record_failed(n: int = 1) -> None:
    """`n` delivery attempts failed (the messages are retried, or parked)."""
    FAILED_TOTAL.inc(n)


def record_parked(n: int = 1) -> None:
    """The relay parked `n` messages."""
    PARKED_TOTAL.inc(n)


def read_outbox_backlog(using: str = "default") -> dict[str, float]:
    """{gauge name: value} from one cheap query on the unpublished rows."""
    with psycopg.Cursor(raw_connection(using)) as cur:
        cur.execute(load(QUERIES_FILE)["outbox_backlog"])
        row = cur.fetchone()
    unpublished, oldest_age, parked = row if row else (0, 0, 0)
    return {UNPUBLISHED: float(unpublished), OLDEST_AGE: float(oldest_age), PARKED: float(parked)}


def register_outbox_gauges(
    registry: CollectorRegistry = REGISTRY, using: str = "default", refresh_s: float = GAUGE_REFRESH_S
) -> DatabaseGauges:
    """Serve the outbox backlog gauges from `registry`, read at most every `refresh_s` seconds."""
    collector = DatabaseGauges(
        GAUGES, lambda: read_outbox_backlog(using), refresh_s=refresh_s, using=using
    )
    registry.register(collector)
    return collector
