"""A stream held back by a transaction open on the database server (docs/outbox-relay.md,
"A held stream"): rows wait after the position, but a transaction older than theirs has not
ended, so none can be read yet. Said once it lasts `warn_after_s`, and its end once more."""

import logging
import time

from outbox.config import Clock, Emit

HELD = "stream held back by a transaction open on the database server"
MOVING = "stream moving again"


class HeldWatch:
    """Call `held()` at every look that finds the stream held, `moving()` when it reads again."""

    def __init__(self, emit: Emit, *, warn_after_s: float, clock: Clock = time.monotonic) -> None:
        self._emit = emit
        self.warn_after_s = warn_after_s
        self._clock = clock
        self._since: float | None = None
        self._said = False

    def held(self) -> None:
        now = self._clock()
        if self._since is None:
            self._since = now
        elif not self._said and now - self._since >= self.warn_after_s:
            self._said = True
            self._emit(logging.WARNING, HELD, {"held_for_s": round(now - self._since, 1)})

    def moving(self) -> None:
        if self._said and self._since is not None:
            self._emit(logging.INFO, MOVING, {"held_for_s": round(self._clock() - self._since, 1)})
        self._since, self._said = None, False
