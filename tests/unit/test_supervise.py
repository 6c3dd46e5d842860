"""core.supervise: the one retry loop, on a fake wait and a seeded randomness."""

import random
import threading
from datetime import timedelta

import pytest

from core.supervise import Backoff, supervise


def backoff(waits: list[float]) -> Backoff:
    return Backoff(timedelta(seconds=1), timedelta(seconds=8), wait=waits.append,
                   rng=random.Random(7))


def test_failures_in_a_row_double_the_wait_up_to_the_cap_with_jitter_over_its_upper_half() -> None:
    waits: list[float] = []
    said: list[tuple[int, float]] = []
    limits = backoff(waits)
    for _ in range(6):
        limits.failed("database", lambda failures, delay: said.append((failures, delay)))
    assert [f for f, _ in said] == [1, 2, 3, 4, 5, 6]
    assert waits == [d for _, d in said]
    for (failures, delay) in said:
        ceiling = min(8.0, 2.0 ** (failures - 1))
        assert ceiling / 2 <= delay <= ceiling


def test_kinds_count_apart_and_a_success_clears_only_what_it_names() -> None:
    limits = backoff([])
    for kind in ("database", "database", "broker"):
        limits.failed(kind, lambda *_: None)
    limits.succeeded("database")
    assert (limits.failures("database"), limits.failures("broker")) == (0, 1)
    limits.succeeded()
    assert limits.failures("broker") == 0


def test_the_loop_retries_its_exceptions_until_stop_and_lets_others_through() -> None:
    stop = threading.Event()
    waits: list[float] = []
    limits = backoff(waits)
    heard: list[tuple[str, int]] = []
    steps = iter([ConnectionError("down"), ConnectionError("down"), None, KeyError("bug")])

    def step() -> None:
        outcome = next(steps)
        if outcome is None:
            limits.succeeded()
            return
        raise outcome

    with pytest.raises(KeyError):
        supervise(step, stop=stop, backoff=limits, retry_on=(ConnectionError,), kind="database",
                  said=lambda exc, failures, _delay: heard.append((str(exc), failures)))
    assert heard == [("down", 1), ("down", 2)] and len(waits) == 2
    assert limits.failures("database") == 0


def test_the_loop_ends_when_stop_is_set() -> None:
    stop = threading.Event()
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        stop.set()

    supervise(step, stop=stop, backoff=backoff([]), retry_on=(ConnectionError,), kind="x",
              said=lambda *_: None)
    assert calls == [1]
