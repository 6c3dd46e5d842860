"""Outbox metrics: the backlog read from the table at scrape time, and the relay's counters.

The relay calls `record_published(n)`, `record_failed(n)` and `record_parked(n)` as delivery
reports come in. The outbox app offers its backlog gauges through core.gauges (apps.py), so
any process that serves metrics shows them: the reminder worker does, so the backlog stays
visible while the relay is down.
"""

from prometheus_client import Counter

from core.gauges import DatabaseGauges
from outbox import store

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
    """{gauge name: value} from the one backlog query."""
    backlog = store.backlog(using)
    return {UNPUBLISHED: float(backlog.unpublished), OLDEST_AGE: backlog.oldest_age_s or 0.0,
            PARKED: float(backlog.parked)}


def outbox_gauges(using: str = "default", refresh_s: float = GAUGE_REFRESH_S) -> DatabaseGauges:
    """The outbox backlog gauges, read at most every `refresh_s` seconds (not registered)."""
    return DatabaseGauges(GAUGES, lambda: read_outbox_backlog(using), refresh_s=refresh_s,
                          using=using)
