"""A Kafka outage in a few log lines (docs/outbox-relay.md, "A broker outage in the log").

librdkafka reports a failing connection on every reconnect attempt, and the relay sees a failed
batch after every backoff: logged as they come, a day's outage was hundreds of thousands of
lines. `OutageLog` says the first failure at once, then at most one line per interval with the
failures repeated since the previous line, and one line when the connection is back. An
outage that starts within the interval after the previous line (a connection that flaps) is
held back until the interval is over, so the log never carries more than one failure line and
one recovery line per interval.
"""

import logging
import time
from collections.abc import Callable
from typing import Any

Clock = Callable[[], float]
# (level, event, fields): the relay's log_event with its relay id.
Emit = Callable[[int, str, dict[str, Any]], None]

FAILING = "kafka connection failing"
STILL_FAILING = "kafka connection still failing"
RESTORED = "kafka connection restored"


class OutageLog:
    """Deduplicates the relay's "cannot reach Kafka" reports: call `failed()` for every one,
    `restored()` when a delivery succeeded or the statistics show a broker up."""

    def __init__(self, emit: Emit, *, interval_s: float, clock: Clock = time.monotonic) -> None:
        self._emit = emit
        self.interval_s = interval_s
        self._clock = clock
        self._failing_since: float | None = None
        self._failures = 0  # in this outage
        self._unreported = 0  # failures since the last line
        self._released = 0  # messages released since the last line
        self._said_failing = False  # this outage has had a line
        self._last_line: float | None = None  # the last failure line, of any outage

    @property
    def failing(self) -> bool:
        return self._failing_since is not None

    def failed(self, error: str, *, released: int = 0) -> None:
        """One failure: a connection error, or a batch the broker did not take (`released`
        messages handed back)."""
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
            self._failures = 0
            self._said_failing = False
        self._failures += 1
        self._unreported += 1
        self._released += released
        if self._last_line is not None and now - self._last_line < self.interval_s:
            return
        fields: dict[str, Any] = {"error": error, "repeats": self._unreported - 1,
                                  "failing_for_s": round(now - self._failing_since, 1)}
        if self._released:
            fields["released"] = self._released
        self._emit(logging.WARNING, STILL_FAILING if self._said_failing else FAILING, fields)
        self._said_failing = True
        self._last_line = now
        self._unreported = self._released = 0

    def restored(self) -> None:
        """Kafka answers again; one line if the outage was reported, none otherwise."""
        if self._failing_since is None:
            return
        if self._said_failing:
            fields: dict[str, Any] = {
                "failing_for_s": round(self._clock() - self._failing_since, 1),
                "failures": self._failures}
            if self._released:
                fields["released"] = self._released
            self._emit(logging.INFO, RESTORED, fields)
            self._unreported = self._released = 0
        self._failing_since = None
