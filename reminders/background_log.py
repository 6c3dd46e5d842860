"""Log lines written on a background thread, in the order they were handed over.

The cycle hands over a committed batch's "reminder queued" lines and goes on with the next
batch: they are formatted and written while the main thread waits on PostgreSQL (which
releases the GIL), instead of adding their cost to every batch.
"""

import logging
import queue
import threading
from collections.abc import Callable
from types import TracebackType


class BackgroundLog:
    """Runs handed-over logging calls on one thread; `close()` (or leaving the `with`) waits
    until every one has run. At most `backlog` calls wait: `submit` then blocks, so memory
    stays flat however far the log falls behind."""

    def __init__(self, name: str = "background-log", backlog: int = 8) -> None:
        self._calls: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=backlog)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], None]) -> None:
        self._calls.put(call)

    def close(self) -> None:
        """Wait for the calls handed over so far; later ones run on the caller's thread."""
        if self._thread.is_alive():
            self._calls.put(None)
            self._thread.join()

    def __enter__(self) -> "BackgroundLog":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                call()
            except Exception:
                # One failing call must not stop the thread: submit() would then wait forever.
                logging.getLogger(__name__).exception("background log call failed")
