"""BackgroundLog runs handed-over calls on its thread, in order, all of them by close()."""

import threading
from collections.abc import Callable

from reminders.background_log import BackgroundLog


def test_calls_run_in_order_on_another_thread_and_close_waits_for_all() -> None:
    seen: list[tuple[int, str]] = []
    release = threading.Event()

    def record(n: int, *, wait: bool = False) -> Callable[[], None]:
        def call() -> None:
            if wait:
                release.wait(timeout=10)
            seen.append((n, threading.current_thread().name))
        return call

    with BackgroundLog() as log:
        log.submit(record(0, wait=True))
        for n in range(1, 5):
            log.submit(record(n))
        assert seen == []  # the first call is still waiting, and nothing ran on this thread
        release.set()
        for n in range(5, 100):  # more than the backlog: submit waits for room
            log.submit(record(n))

    assert [n for n, _ in seen] == list(range(100))
    assert {name for _, name in seen} == {"background-log"}


def test_a_failing_call_does_not_stop_the_ones_after_it() -> None:
    seen: list[int] = []

    def fail() -> None:
        raise RuntimeError("boom")

    with BackgroundLog(backlog=1) as log:
        log.submit(fail)
        for n in range(5):
            log.submit(lambda n=n: seen.append(n))  # type: ignore[misc]

    assert seen == [0, 1, 2, 3, 4]
