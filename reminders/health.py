"""Liveness of the worker (`/healthz`, `check_reminders_health`); readiness (`/readyz`, the
database answers) is core.health's.

Alive: a successful cycle within `max_silence` (the polling interval plus 2 h:
ReminderSettings.max_silence, 26 h at the default 24 h), and no cycle running longer than
its time budget plus a grace (a stuck loop). Ready: the database answers.
"""

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from core.health import Verdict
from reminders import store
from reminders.config import ReminderSettings
from reminders.models import ReminderRun

MAX_SILENCE = ReminderSettings().max_silence  # at the default polling interval
# A batch can outlive the time budget by at most one statement (statement_timeout, 5 min).
STUCK_GRACE = timedelta(minutes=10)


def judge_liveness(
    *,
    now: datetime,
    last_success: datetime | None,
    alive_since: datetime,
    running_since: datetime | None,
    max_run_duration: timedelta,
    max_silence: timedelta = MAX_SILENCE,
) -> Verdict:
    """Pure: is the worker alive? `alive_since` stands in for a success not yet seen."""
    if running_since is not None and now - running_since > max_run_duration + STUCK_GRACE:
        return Verdict(False, f"stuck: a cycle has been running since {running_since.isoformat()}")
    reference = last_success or alive_since
    if now - reference > max_silence:
        seen = last_success.isoformat() if last_success else "never"
        return Verdict(False, f"no successful cycle for over {max_silence} (last: {seen})")
    seen = last_success.isoformat() if last_success else "none yet"
    return Verdict(True, f"ok (last successful cycle: {seen})")


@dataclass
class LoopHealth:
    """What the loop reports to the metrics server: cycles begun and ended."""

    max_run_duration: timedelta
    max_silence: timedelta = MAX_SILENCE
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    last_success: datetime | None = None
    running_since: datetime | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def cycle_started(self, now: datetime | None = None) -> None:
        with self._lock:
            self.running_since = now or datetime.now(UTC)

    def cycle_ended(self, *, succeeded: bool, now: datetime | None = None) -> None:
        with self._lock:
            self.running_since = None
            if succeeded:
                self.last_success = now or datetime.now(UTC)

    def seen_success(self, at: datetime | None) -> None:
        """A success recorded elsewhere (the run history at start-up)."""
        with self._lock:
            if at is not None and (self.last_success is None or at > self.last_success):
                self.last_success = at

    def liveness(self, now: datetime | None = None) -> Verdict:
        with self._lock:
            return judge_liveness(
                now=now or datetime.now(UTC), last_success=self.last_success,
                alive_since=self.started_at, running_since=self.running_since,
                max_run_duration=self.max_run_duration, max_silence=self.max_silence,
            )


def liveness_from_history(
    *, max_run_duration: timedelta, now: datetime | None = None,
    max_silence: timedelta = MAX_SILENCE, using: str = "default",
) -> Verdict:
    """Liveness of the whole fleet from the run history (for the one-shot health check)."""
    now = now or datetime.now(UTC)
    latest = store.latest_run(using)
    last_success = store.last_successful_run_finish(using)
    running_since = latest.started_at if latest and latest.status == ReminderRun.Status.RUNNING else None
    if last_success is None and latest is None:
        return Verdict(False, "no cycle has ever run")
    return judge_liveness(
        now=now, last_success=last_success,
        alive_since=latest.started_at if latest else now, running_since=running_since,
        max_run_duration=max_run_duration, max_silence=max_silence,
    )
