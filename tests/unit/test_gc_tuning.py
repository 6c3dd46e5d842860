"""core.gc_tuning: start-up frozen out of the collector's walks, the young generation collected
less often; the other generations' thresholds kept."""

import gc
from collections.abc import Iterator

import pytest

from core.gc_tuning import YOUNG_THRESHOLD, relax_garbage_collection

PYTHON_DEFAULTS = (700, 10, 10)


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector at Python's settings, nothing frozen (a command run in this process
    earlier, publish_outbox say, may have relaxed it), and put back as it was afterwards."""
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    gc.unfreeze()
    gc.set_threshold(*PYTHON_DEFAULTS)
    try:
        yield
    finally:
        gc.unfreeze()
        if frozen:
            gc.freeze()
        gc.set_threshold(*before)


def test_relaxing_freezes_start_up_and_raises_only_the_young_threshold(collector: None) -> None:
    relax_garbage_collection()

    assert gc.get_threshold() == (YOUNG_THRESHOLD, *PYTHON_DEFAULTS[1:])
    assert gc.get_freeze_count() > 0
