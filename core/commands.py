"""The base of the project's management commands: exit codes, configuration errors as one
line and exit 2, and SIGTERM / SIGINT as a stop event.

The first signal asks the command to stop between operations; a second one restores the
default handler, so an operator can still interrupt it. The signal handler itself takes no
lock (see `stop_on_signals`).
"""

import logging
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.build import describe
from core.config import ConfigError
from core.logs import flush_queued_handlers, leave_stop_signals_to_the_main_thread, log_event

logger = logging.getLogger("core.commands")

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3  # the audit: the database or the broker did not answer

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def usage_error(message: str) -> CommandError:
    """A one-line refusal with exit code 2 (bad options or configuration)."""
    return CommandError(message, returncode=EXIT_USAGE)


class ProjectCommand(BaseCommand):
    """A management command whose ConfigError, raised anywhere in `handle`, ends it with one
    line naming the variable (or option) and exit code 2; its `--version` is the project's."""

    def get_version(self) -> str:
        return describe()

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            return super().execute(*args, **options)
        except ConfigError as exc:
            # An option's name starts with "--": that is usage, not configuration.
            message = str(exc) if exc.name.startswith("--") else f"bad configuration: {exc}"
            flush_queued_handlers()
            raise usage_error(message) from None
        except CommandError:
            flush_queued_handlers()  # the log lines that led here come before the command's line
            raise


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """Install the handlers for the duration of the block; yield the stop event a signal sets.

    The event is set by a watcher thread, never by the Python handler, which runs on the main
    thread between two bytecodes only: a signal landing just before the main thread blocks
    in `stop.wait()` would wait for the whole timeout, and one landing while it holds the
    event's own (non-reentrant) lock would deadlock in `stop.set()`. The C-level handler
    writes the signal's number to a socket (`signal.set_wakeup_fd`) whatever the main thread
    is doing; the watcher, blocked reading it, logs and sets the event from an ordinary
    thread, so every wait wakes at once without polling. The handler takes no lock.
    """
    stop = threading.Event()
    reader, writer = socket.socketpair()
    writer.setblocking(False)  # set_wakeup_fd's rule: the C handler must never block

    def handle(_signum: int, _frame: FrameType | None) -> None:
        # The next signal gets the default behaviour: an operator can still kill a stuck stop.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def watch() -> None:
        leave_stop_signals_to_the_main_thread()
        received = reader.recv(1)  # a signal's number, or nothing once the block ends
        if received:
            # Before the set: the line comes before whatever the stop leads to.
            log_event(logger, logging.WARNING, "stop requested",
                      signal=signal.Signals(received[0]).name)
            stop.set()

    watcher = threading.Thread(target=watch, name="stop-watcher", daemon=True)
    watcher.start()
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    try:
        previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        try:
            for sig in _SIGNALS:
                signal.signal(sig, handle)
            yield stop
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(previous_fd)
    finally:
        writer.close()  # the watcher reads the end of the stream and returns
        watcher.join(timeout=5)
        reader.close()
