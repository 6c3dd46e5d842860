"""The relay's bulk histogram observe against prometheus_client's own, one value at a time."""

from collections import Counter

import pytest
from prometheus_client import CollectorRegistry, Histogram

from outbox.metrics import observe_many

AMOUNTS = [0.0, 0.004, 0.005, 0.0051, 0.3, 1.0, 2.5, 7.0, 60.0, 1e9, 0.25, 0.25]


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for metric in registry.collect() for s in metric.samples
            if not s.name.endswith("_created")}


@pytest.mark.parametrize("amounts", [AMOUNTS, [], [0.5], [0.3] * 5 + [7.0] * 3])
def test_observe_many_equals_observe_one_by_one(amounts: list[float]) -> None:
    one_by_one, at_once = CollectorRegistry(), CollectorRegistry()
    buckets = (0.005, 0.25, 1.0, 5.0, 60.0)
    single = Histogram("latency", "one by one", buckets=buckets, registry=one_by_one)
    bulk = Histogram("latency", "at once", buckets=buckets, registry=at_once)
    for amount in amounts:
        single.observe(amount)

    observe_many(bulk, Counter(amounts).items())  # each distinct amount with its count

    assert _samples(at_once) == _samples(one_by_one)
    assert _samples(at_once)[("latency_count", ())] == len(amounts)


def test_observe_many_refuses_a_histogram_with_labels_like_observe() -> None:
    labelled = Histogram("labelled", "with labels", ["broker"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="label values"):
        labelled.observe(1.0)
    with pytest.raises(ValueError, match="label values"):
        observe_many(labelled, [(1.0, 1)])
