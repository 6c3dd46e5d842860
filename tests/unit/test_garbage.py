"""core.garbage: start-up frozen out of the collector's walks, the young generation collected
less often; the other generations' thresholds kept."""

import gc
from collections.abc import Iterator

import pytest

from core.garbage import YOUNG_THRESHOLD, relax_garbage_collection


@pytest.fixture
def collector() -> Iterator[None]:
    """Put the collector back as it was (the rest of the suite runs at Python's settings)."""
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_relaxing_freezes_start_up_and_raises_only_the_young_threshold(collector: None) -> None:
    _young, middle, old = gc.get_threshold()
    assert gc.get_freeze_count() == 0

    relax_garbage_collection()

    assert gc.get_threshold() == (YOUNG_THRESHOLD, middle, old)
    assert gc.get_freeze_count() > 0
