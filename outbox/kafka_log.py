"""librdkafka's own log lines, into the `outbox.kafka` logger."""

import logging
import time
from collections import OrderedDict
from typing import Any

from outbox.kafka_errors import ERROR_TAIL

logger = logging.getLogger("outbox.kafka")


class RepeatFilter:
    """Lets a line through once per `window_s` seconds; librdkafka repeats a failing connection's
    error every reconnect (twice a second), which would flood the log. It remembers at most
    `max_lines` distinct lines, the least recently let through forgotten first (a flood of
    distinct lines, a broker's address per line say, must not grow the process)."""

    def __init__(self, window_s: float = 60.0, max_lines: int = 1_000) -> None:
        self.window_s = window_s
        self.max_lines = max_lines
        self._last: OrderedDict[str, float] = OrderedDict()

    def fresh(self, line: str) -> bool:
        key = ERROR_TAIL.sub("", line)
        now = time.monotonic()
        if now - self._last.get(key, -self.window_s) < self.window_s:
            return False
        self._last[key] = now
        self._last.move_to_end(key)
        while len(self._last) > self.max_lines:
            self._last.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._last)


# librdkafka's log facilities whose failures the relay reports itself: a failed connection
# (FAIL, ERROR) reaches its error callback and so the outage log (outbox.outage), a fatal
# error (FATAL) its "producer failed fatally" line. Logging both would say each failure twice.
REPORTED_FACILITIES = frozenset({"FAIL", "ERROR", "FATAL"})


class LibrdkafkaLog:
    """librdkafka's own log lines into `outbox.kafka`, without the failures the relay reports
    itself (REPORTED_FACILITIES), without repeats, and with any secret scrubbed."""

    def __init__(self, hidden: list[str] | None = None) -> None:
        self._repeats = RepeatFilter()
        self._hidden = hidden or []

    def log(self, level: int, fmt: str, *args: Any) -> None:
        facility = args[0] if args else ""
        line = fmt % args if args else fmt
        if facility not in REPORTED_FACILITIES and self._repeats.fresh(line):
            for secret in self._hidden:
                line = line.replace(secret, "***")
            logger.log(level, "%s", line)
