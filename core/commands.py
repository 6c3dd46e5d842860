"""The base of the project's management commands: the exit codes of core.exit_codes (listed
at the end of every `--help`), configuration errors as one line and exit 2, a database failure
as one line and its code (never a traceback), and SIGTERM / SIGINT as a stop event.

The first signal asks the command to stop between operations; a second one restores the
default handler, so an operator can still interrupt it. The signal handler itself takes no
lock (see `stop_on_signals`).
"""

import logging
import re
import signal
import socket
import textwrap
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Any, ClassVar

from django.core.management.base import BaseCommand, CommandError, CommandParser, DjangoHelpFormatter

from core.build import describe
from core.config import ConfigError
from core.db import DatabaseErrors
from core.exit_codes import ALL, ExitCode, epilog, for_database_failure
from core.failures import classify_on
from core.logs import flush_queued_handlers, leave_stop_signals_to_the_main_thread, log_event

logger = logging.getLogger("core.commands")

# The commands' older names for three of the codes.
EXIT_FAILED = ExitCode.FAILED
EXIT_USAGE = ExitCode.USAGE
EXIT_UNAVAILABLE = ExitCode.UNAVAILABLE

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_CODE_LINE = re.compile(r"^(\s+\d+\s+)(.*)$")  # an exit code's line of the epilog


def usage_error(message: str) -> CommandError:
    """A one-line refusal with exit code 2 (bad options or configuration)."""
    return CommandError(message, returncode=EXIT_USAGE)


def refused(message: str) -> CommandError:
    """A one-line refusal with exit code 4 (a person must act before it runs again)."""
    return CommandError(message, returncode=ExitCode.REFUSED)


class _EpilogFormatter(DjangoHelpFormatter):
    """Django's help layout, a text's own lines kept: the exit codes one a line, each wrapped
    under its meaning."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        filled = []
        for line in text.splitlines():
            code = _CODE_LINE.match(line)
            lead, body = (code[1], code[2]) if code else ("", line)
            filled.append(textwrap.fill(" ".join(body.split()), width,
                                        initial_indent=indent + lead,
                                        subsequent_indent=indent + " " * len(lead)))
        return "\n".join(filled)


class ExitCodeContract(BaseCommand):
    """The exit-code contract (core.exit_codes) on any command, Django's own included: its
    `--help` ends with its codes, its `--version` is the project's, a ConfigError raised
    anywhere in `handle` ends it with one line naming the variable (or option) and exit 2, and
    a database failure with one line saying which (core.failures) and its code."""

    # The codes the command exits with, and what one of them means for it, when that helps.
    exit_codes: ClassVar[tuple[ExitCode, ...]] = ALL
    exit_notes: ClassVar[Mapping[ExitCode, str]] = {}
    # What the one line of a database failure starts with.
    database_failure_prefix: ClassVar[str] = ""

    def get_version(self) -> str:
        return describe()

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        kwargs.setdefault("epilog", epilog(self.exit_codes, self.exit_notes))
        kwargs.setdefault("formatter_class", _EpilogFormatter)
        return super().create_parser(prog_name, subcommand, **kwargs)

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
        except DatabaseErrors as exc:
            # Which (unreachable, a table or grant missing, another error), never a password.
            failure = classify_on(exc, "default")
            flush_queued_handlers()
            raise CommandError(f"{self.database_failure_prefix}{failure.reason}",
                               returncode=for_database_failure(failure)) from None


class ProjectCommand(ExitCodeContract):
    """A project's management command: the exit-code contract on Django's BaseCommand."""


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
