"""A Kafka outage in a few log lines (docs/outbox-relay.md, "A broker outage in the log").

librdkafka reports a failing connection on every reconnect attempt, and the relay sees a failed
batch after every backoff: logged as they come, a day's outage was hundreds of thousands of
lines. `OutageLog` says the first failure at once, then at most one line per interval with the
failures repeated since the previous line, and one line when the connection is back. An
outage that starts within the interval after the previous line (a connection that flaps) is
held back until the interval is over, so the log never carries more than one failure line and
one recovery line per interval.

`PartitionOutages` keeps one such log per partition that could not take rows while the rest
of the cluster took them (docs/outbox-relay.md, "One partition's outage"), with lines of its own.
"""

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

Clock = Callable[[], float]
# (level, event, fields): the relay's log_event with its relay id.
Emit = Callable[[int, str, dict[str, Any]], None]

FAILING = "kafka connection failing"
STILL_FAILING = "kafka connection still failing"
RESTORED = "kafka connection restored"
PARTITION_FAILING = "kafka partition unavailable"
PARTITION_STILL_FAILING = "kafka partition still unavailable"
PARTITION_RESTORED = "kafka partition available again"

Partition = tuple[str, int]  # (topic, partition); -1 when none was assigned to the row yet


class OutageLog:
    """Deduplicates the relay's "cannot reach Kafka" reports: call `failed()` for every one,
    `restored()` when a delivery succeeded or the statistics show a broker up."""

    def __init__(self, emit: Emit, *, interval_s: float, clock: Clock = time.monotonic,
                 events: tuple[str, str, str] = (FAILING, STILL_FAILING, RESTORED),
                 counted: str = "released") -> None:
        self._emit = emit
        self.interval_s = interval_s
        self._clock = clock
        self._events = events  # (first failure, repeated failures, restored)
        self._counted = counted  # the name of the messages-handed-back field
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
            fields[self._counted] = self._released
        self._emit(logging.WARNING, self._events[1] if self._said_failing else self._events[0],
                   fields)
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
                fields[self._counted] = self._released
            self._emit(logging.INFO, self._events[2], fields)
            self._unreported = self._released = 0
        self._failing_since = None


class PartitionOutages:
    """The partitions that could not take rows while the cluster took others: an outage log
    for each (its lines carry the topic and partition), how many batches in a row each failed
    (its rows' retry delay grows with it), and the partition each deferred key was bound for
    (a delivery of that key says the partition is back, and its other keys are due at once:
    `take_due`)."""

    def __init__(self, emit: Emit, *, interval_s: float, clock: Clock = time.monotonic) -> None:
        self._emit = emit
        self.interval_s = interval_s
        self._clock = clock
        self._logs: dict[Partition, OutageLog] = {}
        self._failures: dict[Partition, int] = {}
        self._keys: dict[str, Partition] = {}
        # Keys deferred for a partition that is back: their waiting rows are due at once.
        self._due: list[str] = []

    @property
    def down(self) -> set[Partition]:
        """The partitions in an outage now."""
        return set(self._failures)

    def failed(self, partition: Partition, keys: Iterable[str], error: str) -> int:
        """A batch's rows of `keys` deferred for `partition`: its batches failed in a row,
        this one included."""
        keys = list(keys)
        self._keys.update((key, partition) for key in keys)
        failures = self._failures[partition] = self._failures.get(partition, 0) + 1
        self._log(partition).failed(error, released=len(keys))
        return failures

    def delivered(self, keys: Iterable[str]) -> set[Partition]:
        """Rows of `keys` delivered: the partitions they were deferred for are back."""
        back = {p for p in (self._keys.pop(key, None) for key in keys) if p is not None}
        back &= set(self._failures)
        for partition in back:
            self._back(partition)
        return back

    def ready(self, topic: str, number: int) -> bool:
        """The topic's metadata shows the partition able to take rows again (TopicWatch): if it
        was in an outage it is back, and True."""
        partition = (topic, number)
        if partition not in self._failures:
            return False
        self._back(partition)
        return True

    def take_due(self) -> list[str]:
        """The keys whose partition came back since the last call (their rows wait no longer)."""
        due, self._due = self._due, []
        return due

    def _back(self, partition: Partition) -> None:
        """Its other deferred keys are due at once; a later outage starts afresh."""
        self._due.extend(k for k, p in self._keys.items() if p == partition)
        self._keys = {k: p for k, p in self._keys.items() if p != partition}
        del self._failures[partition]
        self._log(partition).restored()

    def _log(self, partition: Partition) -> OutageLog:
        if partition not in self._logs:
            topic, number = partition

            def emit(level: int, event: str, fields: dict[str, Any]) -> None:
                self._emit(level, event, {"topic": topic, "partition": number, **fields})

            self._logs[partition] = OutageLog(
                emit, interval_s=self.interval_s, clock=self._clock, counted="deferred",
                events=(PARTITION_FAILING, PARTITION_STILL_FAILING, PARTITION_RESTORED))
        return self._logs[partition]
