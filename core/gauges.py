"""Gauges read from the database when Prometheus scrapes, at most once per refresh interval,
and the registry through which an app offers its gauges to any process that serves metrics.

Scrapes arrive on the metrics server's request threads: each read uses that thread's own
Django connection and closes it afterwards, so the worker holds no idle connection.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from core.db import DatabaseErrors, thread_connection
from core.logs import log_event

logger = logging.getLogger("core.gauges")

Reader = Callable[[], Mapping[str, float]]


class DatabaseGauges(Collector):
    """Gauges `{name: help}` whose values `read()` returns; cached for `refresh_s` seconds.

    With `background`, a stale cache is refreshed on a thread of its own and the scrape gets
    the previous values at once (a slow query never makes a scrape time out); only the very
    first scrape waits for a read, up to `first_wait_s`. A failed read keeps the last values
    (logged) and is retried after `refresh_s`: the readiness probe reports the database.
    """

    def __init__(
        self,
        gauges: Mapping[str, str],
        read: Reader,
        *,
        refresh_s: float,
        using: str = "default",
        clock: Callable[[], float] = time.monotonic,
        background: bool = False,
        first_wait_s: float = 5.0,
    ) -> None:
        self.gauges = dict(gauges)
        self.read = read
        self.refresh_s = refresh_s
        self.using = using
        self.clock = clock
        self.background = background
        self.first_wait_s = first_wait_s
        self._lock = threading.RLock()
        self._values: dict[str, float] = {}
        self._read_at: float | None = None
        self._refresher: threading.Thread | None = None

    def invalidate(self) -> None:
        """Read again at the next scrape (after a cycle changed what the gauges count)."""
        with self._lock:
            self._read_at = None

    def _stale(self) -> bool:
        return self._read_at is None or self.clock() - self._read_at >= self.refresh_s

    def _read_and_store(self) -> None:
        values: dict[str, float] | None
        try:
            with thread_connection(self.using):
                values = {k: float(v) for k, v in self.read().items()}
        except DatabaseErrors as exc:
            log_event(logger, logging.WARNING, "metrics read failed",
                      gauges=sorted(self.gauges), error=type(exc).__name__)
            values = None
        with self._lock:
            if values is not None:
                self._values = values
            self._read_at = self.clock()  # after a failure too: retry after refresh_s, not per scrape

    def _refresh_in_background(self) -> None:
        try:
            self._read_and_store()
        finally:
            with self._lock:
                self._refresher = None

    def values(self) -> dict[str, float]:
        """The current values, read from the database when the cache is stale."""
        if not self.background:
            with self._lock:
                if self._stale():
                    self._read_and_store()
                return dict(self._values)
        with self._lock:
            if self._stale() and self._refresher is None:
                self._refresher = threading.Thread(
                    target=self._refresh_in_background, name="metrics-refresh", daemon=True)
                self._refresher.start()
            first, refresher = not self._values, self._refresher
        if first and refresher is not None:
            refresher.join(self.first_wait_s)
        with self._lock:
            return dict(self._values)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Without describe(), registering would call collect() and so query the database.
        for name, text in self.gauges.items():
            yield GaugeMetricFamily(name, text)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        values = self.values()
        for name, text in self.gauges.items():
            if name in values:
                yield GaugeMetricFamily(name, text, value=values[name])


# Gauges an app offers to every process that serves metrics: app AppConfig.ready() adds a
# factory (alias -> gauges); the serving process installs them. So the worker serves the
# outbox backlog without reminders importing outbox.
GaugeFactory = Callable[[str], DatabaseGauges]
_offered: dict[str, GaugeFactory] = {}
_installed: dict[tuple[str, str], DatabaseGauges] = {}


def offer(name: str, factory: GaugeFactory) -> None:
    """Offer the gauges `factory(using)` builds under `name` (once per name)."""
    _offered[name] = factory


def install(using: str = "default", registry: CollectorRegistry = REGISTRY
            ) -> tuple[DatabaseGauges, ...]:
    """Register every offered gauge set for `using` in `registry`, once per process; the sets."""
    for name, factory in _offered.items():
        if (name, using) not in _installed:
            collector = factory(using)
            registry.register(collector)
            _installed[name, using] = collector
    return tuple(c for (_, alias), c in _installed.items() if alias == using)
