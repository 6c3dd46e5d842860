"""The base of the project's management commands: exit codes, configuration errors as one
line and exit 2, and SIGTERM / SIGINT as a stop event.

The first signal asks the command to stop between operations; a second one restores the
default handler, so an operator can still interrupt it.
"""

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.config import ConfigError
from core.logs import leave_stop_signals_to_the_main_thread, log_event

logger = logging.getLogger("core.commands")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def usage_error(message: str) -> CommandError:
    """A one-line refusal with exit code 2 (bad options or configuration)."""
    return CommandError(message, returncode=EXIT_USAGE)


class ProjectCommand(BaseCommand):
    """A management command whose ConfigError, raised anywhere in `handle`, ends it with one
    line naming the variable (or option) and exit code 2."""

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            return super().execute(*args, **options)
        except ConfigError as exc:
            # An option's name starts with "--": that is usage, not configuration.
            message = str(exc) if exc.name.startswith("--") else f"bad configuration: {exc}"
            flush_log_handlers()
            raise usage_error(message) from None
        except CommandError:
            flush_log_handlers()  # the log lines that led here come before the command's line
            raise


def flush_log_handlers() -> None:
    """Write what every handler still holds (the stderr handler queues its records)."""
    loggers = [logging.getLogger(), *(item for item in logging.Logger.manager.loggerDict.values()
                                     if isinstance(item, logging.Logger))]
    for each in loggers:
        for handler in each.handlers:
            handler.flush()


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """Install the handlers for the duration of the block; yield the stop event they set."""
    stop = threading.Event()
    wake = threading.Event()
    received: list[str] = []
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}

    def handle(signum: int, _frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()
        wake.set()
        # The next signal gets the default behaviour: an operator can still kill a stuck stop.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def announce() -> None:
        # Logged here, not in the handler: the handler may interrupt the main thread while it
        # holds the logging queue's lock, and logging from it there would deadlock.
        leave_stop_signals_to_the_main_thread()
        wake.wait()
        if received:
            log_event(logger, logging.WARNING, "stop requested", signal=received[0])

    announcer = threading.Thread(target=announce, name="stop-announcer", daemon=True)
    announcer.start()
    for sig in _SIGNALS:
        signal.signal(sig, handle)
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        wake.set()
        announcer.join(timeout=5)
