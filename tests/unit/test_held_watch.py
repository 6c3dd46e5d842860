"""HeldWatch (outbox/lanes.py) on a clock the test moves: a held stream is said once it lasts
`warn_after_s`, once only, and its end once, only if it was said."""

import logging
from typing import Any

from outbox.lanes import HELD, MOVING, HeldWatch


class Watch:
    def __init__(self, warn_after_s: float = 30.0) -> None:
        self.now = 1000.0
        self.said: list[tuple[int, str, dict[str, Any]]] = []
        self.watch = HeldWatch(lambda level, message, fields: self.said.append(
            (level, message, fields)), warn_after_s=warn_after_s, clock=lambda: self.now)

    def held_at(self, *offsets: float) -> None:
        start = self.now
        for offset in offsets:
            self.now = start + offset
            self.watch.held()


def test_a_hold_shorter_than_the_threshold_says_nothing_even_when_it_ends() -> None:
    w = Watch()
    w.held_at(0, 10, 29.9)
    w.watch.moving()
    assert w.said == []


def test_a_hold_that_lasts_the_threshold_is_said_once_with_how_long() -> None:
    w = Watch()
    w.held_at(0, 30, 45, 60)
    assert w.said == [(logging.WARNING, HELD, {"held_for_s": 30.0})]


def test_its_end_is_said_once_with_the_whole_hold() -> None:
    w = Watch()
    w.held_at(0, 31)
    w.now += 9
    w.watch.moving()
    w.watch.moving()
    assert w.said[1:] == [(logging.INFO, MOVING, {"held_for_s": 40.0})]


def test_a_new_hold_after_moving_counts_from_its_own_start() -> None:
    w = Watch()
    w.held_at(0, 31)
    w.watch.moving()
    w.said.clear()
    w.held_at(0, 29)
    assert w.said == []
    w.held_at(1)  # 30 s after the new hold began (the clock moved 29 + 1)
    assert w.said == [(logging.WARNING, HELD, {"held_for_s": 30.0})]
