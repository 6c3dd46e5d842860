"""core.metrics: an app's metrics are in no registry until a process installs them, once."""

from prometheus_client import CollectorRegistry, Counter

from core.metrics import MetricSet


def test_metrics_are_registered_only_when_installed_and_only_once() -> None:
    counted = Counter("test_metric_set_things_total", "Things.", registry=None)
    metrics = MetricSet(counted)
    registry = CollectorRegistry()
    counted.inc(2)
    assert registry.get_sample_value("test_metric_set_things_total") is None

    metrics.install(registry)
    metrics.install(registry)  # again: nothing (a second register would raise)

    assert registry.get_sample_value("test_metric_set_things_total") == 2
    assert registry.get_sample_value("test_metric_set_things_created") is None
