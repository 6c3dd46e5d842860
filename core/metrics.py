"""How an app's own metrics are registered: built in no registry at import, and installed
into the registry by the process that counts or serves them (`MetricSet.install`), so that a
process exports only the metrics it really updates (the relay's are not in the worker's
/metrics stuck at 0, and the other way round).

The `_created` series double every counter's output and no rule or panel reads them;
prometheus_client switches them off for the whole process only, so the first install does.
"""

import threading

from prometheus_client import REGISTRY, CollectorRegistry, disable_created_metrics
from prometheus_client.registry import Collector


class MetricSet:
    """Metrics built with `registry=None`, registered together, once per registry."""

    def __init__(self, *metrics: Collector) -> None:
        self.metrics = metrics
        self._installed: set[int] = set()
        self._lock = threading.Lock()

    def install(self, registry: CollectorRegistry = REGISTRY) -> None:
        """Register the set in `registry` (again: nothing)."""
        with self._lock:
            if id(registry) in self._installed:
                return
            disable_created_metrics()  # type: ignore[no-untyped-call]
            for metric in self.metrics:
                registry.register(metric)
            self._installed.add(id(registry))
