"""A progress bar for the long manual commands (a cycle, a relay pass, a prune): a tqdm bar on
stderr when stderr is a terminal, with the log lines written above it; nothing at all when it
is not (under a supervisor the JSON log lines say it all, and no bar character reaches them).

The project's log lines are written by the logging thread of `core.logs.QueuedStderrHandler`,
which tqdm's `logging_redirect_tqdm` does not see (it swaps only plain stream handlers on the
loggers): while a bar is shown, `core.logs.lines_written_through` sends those lines through
`tqdm.write`, which clears the bar, writes the lines and draws the bar again, under tqdm's
lock, so a log line never lands inside the bar's line.
"""

import logging
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Never, TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from core.logs import flush_queued_handlers, lines_written_through

APP_LOGGERS = ("core", "reminders", "outbox", "devtools")


class ProgressBar:
    """Call it with (done, total) as the work goes; a no-op unless `stream` is a terminal.
    Use it as a context manager: the bar and the log redirection end with the block."""

    def __init__(self, description: str, unit: str, *, stream: TextIO | None = None) -> None:
        self.description = description
        self.unit = unit
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self._bar: tqdm[Never] | None = None
        self._stack = ExitStack()

    def __enter__(self) -> "ProgressBar":
        if self.enabled:
            self._bar = tqdm(desc=self.description, unit=self.unit, file=self.stream,
                             dynamic_ncols=True, leave=True, mininterval=0.2)
            self._stack.enter_context(_log_lines_above_the_bar(self.stream))
        return self

    def __call__(self, done: int, total: int | None = None) -> None:
        """The work done so far, out of `total` (None: not known)."""
        if self._bar is None:
            return
        if total is not None and total != self._bar.total:
            self._bar.total = max(total, done)
        self._bar.update(done - self._bar.n)

    def __exit__(self, *exc: object) -> None:
        if self._bar is None:
            return
        flush_queued_handlers()  # what was logged during the work goes above the bar
        self._bar.close()  # the final state stays on its own line
        self._bar = None
        self._stack.close()  # later log lines go straight to stderr again


def _writes_to_the_console(logger: logging.Logger) -> bool:
    return any(isinstance(h, logging.StreamHandler) and h.stream in {sys.stdout, sys.stderr}
               for h in logger.handlers)


@contextmanager
def _log_lines_above_the_bar(stream: TextIO) -> Iterator[None]:
    # tqdm's redirect adds its handler to every logger it is given: only to those with a
    # plain console handler of their own (none under the project's settings), or each
    # record would be written twice.
    loggers = [logger for logger in (logging.getLogger(), *map(logging.getLogger, APP_LOGGERS))
               if _writes_to_the_console(logger)]
    with logging_redirect_tqdm(loggers=loggers), lines_written_through(
            lambda text: tqdm.write(text, file=stream, end="")):
        yield
