"""librdkafka's own log lines, into the `outbox.kafka` logger."""

import logging
import time
from typing import Any

from outbox.kafka_errors import ERROR_TAIL

logger = logging.getLogger("outbox.kafka")


class RepeatFilter:
    """Lets a line through once per `window_s` seconds; librdkafka repeats a failing connection's
    error every reconnect (twice a second), which would flood the log."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._last: dict[str, float] = {}

    def fresh(self, line: str) -> bool:
        key = ERROR_TAIL.sub("", line)
        now = time.monotonic()
        if now - self._last.get(key, -self.window_s) < self.window_s:
            return False
        self._last[key] = now
        return True


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
