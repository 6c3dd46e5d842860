"""Liveness of the worker (`/healthz`, `check_reminders_health`); readiness (`/readyz`, the
database answers) is core.health's.

Alive: a successful cycle within `max_silence` (the polling interval plus 2 h:
ReminderSettings.max_silence, 26 h at the default 24 h), and no cycle running longer than
its time budget plus a grace (a stuck loop).

Ages, never instants, are judged, each measured on one clock: the run history's on the
database's (its `now()` stamped `started_at` and `finished_at`, and the ages are computed
there: `store.run_history_ages`), a loop's own cycles on the worker's. A worker whose clock
is hours or years off the database's judges the run history as one whose clock is right.
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
    since_success: timedelta | None,
    alive_for: timedelta,
    running_for: timedelta | None,
    max_run_duration: timedelta,
    max_silence: timedelta = MAX_SILENCE,
    last_success: datetime | None = None,
    running_since: datetime | None = None,
) -> Verdict:
    """Pure: is the worker alive? Ages on one clock: `since_success` (None: no success seen),
    `alive_for` (stands in for a success not yet seen), `running_for` (None: no cycle under
    way). `last_success` and `running_since`, the recorded instants, only go into the reason."""
    if running_for is not None and running_for > max_run_duration + STUCK_GRACE:
        if running_since is None:
            return Verdict(False, f"stuck: a cycle has been running for {running_for}")
        return Verdict(False, f"stuck: a cycle has been running since {running_since.isoformat()}")
    if (alive_for if since_success is None else since_success) > max_silence:
        seen = _seen(last_success, since_success, "never")
        return Verdict(False, f"no successful cycle for over {max_silence} (last: {seen})")
    return Verdict(True, f"ok (last successful cycle: {_seen(last_success, since_success, 'none yet')})")


def _seen(at: datetime | None, age: timedelta | None, otherwise: str) -> str:
    if at is not None:
        return at.isoformat()
    return otherwise if age is None else f"{age} ago"


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class LoopHealth:
    """What the loop reports to the metrics server: cycles begun and ended, on the worker's
    clock; a success seen in the run history comes as its age on the database's clock."""

    max_run_duration: timedelta
    max_silence: timedelta = MAX_SILENCE
    started_at: datetime = field(default_factory=_now)
    last_success: datetime | None = None
    running_since: datetime | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def cycle_started(self, now: datetime | None = None) -> None:
        with self._lock:
            self.running_since = now or _now()

    def cycle_ended(self, *, succeeded: bool, now: datetime | None = None) -> None:
        with self._lock:
            self.running_since = None
            if succeeded:
                self.last_success = now or _now()

    def seen_success(self, age: timedelta | None, now: datetime | None = None) -> None:
        """A success recorded elsewhere (the run history at start-up), `age` ago on the
        database's clock: placed that long before now on the worker's clock."""
        with self._lock:
            if age is None:
                return
            at = (now or _now()) - age
            if self.last_success is None or at > self.last_success:
                self.last_success = at

    def liveness(self, now: datetime | None = None) -> Verdict:
        with self._lock:
            now = now or _now()
            return judge_liveness(
                since_success=None if self.last_success is None else now - self.last_success,
                alive_for=now - self.started_at,
                running_for=None if self.running_since is None else now - self.running_since,
                max_run_duration=self.max_run_duration, max_silence=self.max_silence,
                last_success=self.last_success, running_since=self.running_since,
            )


def liveness_from_history(
    *, max_run_duration: timedelta, max_silence: timedelta = MAX_SILENCE, using: str = "default",
) -> Verdict:
    """Liveness of the whole fleet from the run history (for the one-shot health check),
    aged on the database's clock: the worker's clock plays no part."""
    ages = store.run_history_ages(using)
    if ages.latest_age is None:
        return Verdict(False, "no cycle has ever run")
    running = ages.latest_status == ReminderRun.Status.RUNNING
    return judge_liveness(
        since_success=ages.since_success, alive_for=ages.latest_age,
        running_for=ages.latest_age if running else None,
        max_run_duration=max_run_duration, max_silence=max_silence,
        last_success=ages.last_success, running_since=ages.latest_started_at if running else None,
    )
