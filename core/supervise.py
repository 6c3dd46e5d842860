"""One supervised retry loop for the long-running processes (the `--loop` of the worker, the
relay and the audit): a step run until stop, each consecutive failure of a kind waited out
with a backoff doubling from `initial` to `cap`, jittered so that a fleet does not retry in
lockstep (backoff_delay). Its clock, wait and randomness are arguments, for the tests."""

import functools
import random
import threading
from collections.abc import Callable
from datetime import timedelta


def backoff_delay(failures: int, initial: timedelta, cap: timedelta, rng: random.Random) -> float:
    """Seconds to wait after `failures` consecutive failures: doubling from `initial`, capped at
    `cap`, with jitter over the upper half so that a fleet does not retry in lockstep."""
    ceiling = min(cap.total_seconds(), initial.total_seconds() * 2 ** max(0, failures - 1))
    return rng.uniform(ceiling / 2, ceiling)


Wait = Callable[[float], object]
# Told (failures of this kind in a row, seconds about to be waited) before each wait.
Said = Callable[[int, float], object]


class Backoff:
    """Consecutive failures, per kind, and the wait after each."""

    def __init__(self, initial: timedelta, cap: timedelta, *, wait: Wait,
                 rng: random.Random | None = None) -> None:
        self.initial = initial
        self.cap = cap
        self._wait = wait
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._failures: dict[str, int] = {}

    def failures(self, kind: str) -> int:
        return self._failures.get(kind, 0)

    def succeeded(self, *kinds: str) -> None:
        """The step did what `kinds` failed at (every kind when none is named)."""
        for kind in kinds or tuple(self._failures):
            self._failures.pop(kind, None)

    def failed(self, kind: str, said: Said) -> float:
        """One more failure of `kind`: tell `said`, then wait; the seconds waited."""
        failures = self._failures[kind] = self.failures(kind) + 1
        delay = backoff_delay(failures, self.initial, self.cap, self._rng)
        said(failures, delay)
        self._wait(delay)
        return delay


def supervise(step: Callable[[], object], *, stop: threading.Event, backoff: Backoff,
              retry_on: tuple[type[BaseException], ...], kind: str,
              said: Callable[[BaseException, int, float], object]) -> None:
    """Run `step` until `stop` is set. A `retry_on` exception is a failure of `kind`: `said`
    hears it (with the failures in a row and the wait ahead), then the backoff waits. A step
    that returns clears the failures it names itself (Backoff.succeeded)."""
    while not stop.is_set():
        try:
            step()
        except retry_on as exc:
            backoff.failed(kind, functools.partial(said, exc))
