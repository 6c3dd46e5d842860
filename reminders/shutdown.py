"""SIGTERM / SIGINT handling: the first signal asks the worker to stop between operations;
a second one restores the default handler, so an operator can still interrupt it."""

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from reminders.logs import log_event

logger = logging.getLogger("reminders.shutdown")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """Install the handlers for the duration of the block; yield the stop event they set."""
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}

    def handle(signum: int, _frame: FrameType | None) -> None:
        stop.set()
        # The next signal gets the default behaviour: an operator can still kill a stuck stop.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log_event(logger, logging.WARNING, "stop requested",
                  signal=signal.Signals(signum).name)

    for sig in _SIGNALS:
        signal.signal(sig, handle)
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
