"""Health of the long-running commands: a verdict for `/healthz` and `/readyz`, the relay's
heartbeat, and readiness as "the database answers"."""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.db import connections

from core.db import DatabaseErrors, thread_connection
from core.queries import QueryFile

QUERIES = QueryFile(Path(__file__).parent / "sql" / "health.sql")


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str


@dataclass
class Heartbeat:
    """Liveness of a loop without a daily success (the relay): it must beat every `timeout`."""

    timeout: timedelta
    last_beat: datetime = field(default_factory=lambda: datetime.now(UTC))

    def beat(self, now: datetime | None = None) -> None:
        self.last_beat = now or datetime.now(UTC)

    def liveness(self, now: datetime | None = None) -> Verdict:
        silent = (now or datetime.now(UTC)) - self.last_beat
        if silent > self.timeout:
            return Verdict(False, f"stuck: no loop iteration for {silent}")
        return Verdict(True, "ok")


def database_ready(using: str = "default") -> Verdict:
    """Does the database answer a trivial query?"""
    try:
        with thread_connection(using), connections[using].cursor() as cursor:
            cursor.execute(QUERIES["database_ready"])
            cursor.fetchone()
    except DatabaseErrors as exc:
        return Verdict(False, f"database unavailable: {type(exc).__name__}")
    return Verdict(True, "ok")
