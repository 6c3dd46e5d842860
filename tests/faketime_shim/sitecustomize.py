"""On PYTHONPATH only under scripts/clock.sh, in every Python process the tests start.

libfaketime 0.9.10 fails Python's time.sleep (clock_nanosleep on CLOCK_MONOTONIC with
TIMER_ABSTIME) with EINVAL when monotonic clocks stay real (FAKETIME_DONT_FAKE_MONOTONIC=1),
and faking them hangs timed lock waits; a timed lock wait on the real monotonic clock works.
"""

import threading
import time


def _sleep(seconds: float) -> None:
    """time.sleep, as a timed wait on an event nobody sets."""
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


time.sleep = _sleep
