"""Structured logging: one JSON object per line under a supervisor, readable text on a terminal.

Log calls name an event and pass its fields; the formatter decides the shape. Text lines
show every value through `printable`: a newline or a terminal escape in a value from outside
(a document's type, a topic's record) cannot forge a line or repaint the screen; JSON escapes
them itself.
Fields never carry personal data: callers pass ids, types, thresholds and counts
only (the number mask and the payload never reach a logger).

Records are formatted and written off the caller's thread: `QueuedStderrHandler` hands them
to a `QueueListener`, whose thread formats and writes them while the caller goes on (and
PostgreSQL's waits release the GIL). `log_events` logs one event per item as a single
record that the formatter writes as a line per item, in one write: a batch's "reminder
queued" lines cost the batch one record, not one each. Items given as `Rows` (the rows a
query returned, and the names of their leading values) are rendered straight from the rows
with orjson, a few microseconds a line instead of some twenty; the bytes are those of the
general path (any row it cannot render alike takes the general path).
"""

import copy
import io
import json
import logging
import os
import queue
import re
import signal
import sys
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from logging.handlers import QueueHandler, QueueListener
from typing import Any, overload

import orjson

_FIELDS = "fields"
# log_events: the field holding the per-line fields (kept among the record's fields, so that
# whoever inspects the record, a test's log capture say, sees every item).
_EACH = "each"
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
# Values orjson renders exactly as json.dumps(_jsonable(value)) does (given ASCII output).
_PLAIN_TYPES = frozenset({str, int, bool, type(None), uuid.UUID})
# Control characters (C0, DEL, C1), line and paragraph separators, and the bidirectional
# overrides that reorder what a terminal shows.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    return repr(match[0])[1:-1]


def printable(text: str) -> str:
    """`text` with every control character escaped as Python writes it (`\\n`, `\\x1b`,
    `\\u202e`): one line, shown as it is, for a log line or a report."""
    return text if text.isprintable() else _UNPRINTABLE.sub(_escaped, text)


def leave_stop_signals_to_the_main_thread() -> None:
    """Block SIGINT and SIGTERM in the calling (helper) thread: the kernel then delivers them
    to the main thread, the only one where Python runs signal handlers; one delivered to a
    helper thread would leave a main thread asleep in a wait unaware of it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)


def log_event(
    logger: logging.Logger, level: int, event: str, *,
    exc_info: bool | BaseException | None = False, **fields: Any
) -> None:
    """Log `event` with structured `fields` (ids, counts, thresholds; never PII); `exc_info`
    as logging's (True: the exception being handled, or an exception caught earlier)."""
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={_FIELDS: fields}, exc_info=exc_info, stacklevel=2)


def log_events(
    logger: logging.Logger, level: int, event: str, items: Sequence[Mapping[str, Any]],
    **fields: Any,
) -> None:
    """Log `event` once per item, with `fields` and the item's own fields, as one record: the
    formatter writes a line per item (on the logging thread, with QueuedStderrHandler)."""
    if items and logger.isEnabledFor(level):
        logger.log(level, event, extra={_FIELDS: {**fields, _EACH: items}}, stacklevel=2)


class Rows(Sequence[Mapping[str, Any]]):
    """`log_events` items as rows: each row's leading values named by `keys` (values past
    them are ignored). Read as a sequence, the items are the dicts; the JSON formatter renders
    the rows themselves, without a dict or a record per line."""

    __slots__ = ("keys", "rows")

    def __init__(self, keys: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.keys = tuple(keys)
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> Mapping[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Mapping[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [dict(zip(self.keys, row, strict=False)) for row in self.rows[index]]
        return dict(zip(self.keys, self.rows[index], strict=False))

    def __repr__(self) -> str:
        return repr(list(self))


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


class StructuredFormatter(logging.Formatter):
    """`fmt` is `json`, `text`, or `auto` (JSON unless stderr is a terminal)."""

    def __init__(self, fmt: str = "auto") -> None:
        super().__init__()
        if fmt not in {"auto", "json", "text"}:
            raise ValueError(f"LOG_FORMAT must be auto, json or text, not {fmt!r}")
        self.as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())

    def format(self, record: logging.LogRecord) -> str:
        """The record's lines: one, or one per item of a `log_events` record."""
        fields: dict[str, Any] = getattr(record, _FIELDS, {})
        if _EACH not in fields:
            return self._format(record, fields)
        common = {k: v for k, v in fields.items() if k != _EACH}
        items = fields[_EACH]
        if (isinstance(items, Rows) and self.as_json and common.keys().isdisjoint(items.keys)
                and not record.exc_info and not record.exc_text):
            return self._format_rows(record, common, items)
        return "\n".join(self._format(record, {**common, **item}) for item in items)

    def _format_rows(self, record: logging.LogRecord, common: dict[str, Any], items: Rows) -> str:
        """A line per row, as `_format` writes it: the record's part rendered once, each
        row's values by orjson (a row orjson would render otherwise takes `_format`)."""
        head = self._format(record, common)  # '{"ts":...,"event":...,<common>}'
        if not items.keys:
            return "\n".join(head for _ in items.rows)
        prefix = head[:-1].encode() + b","
        keys, plain, dumps = items.keys, _PLAIN_TYPES.issuperset, orjson.dumps
        lines: list[bytes] = []
        for row in items.rows:
            item = dict(zip(keys, row, strict=False))
            try:
                body = dumps(item) if plain(map(type, item.values())) else b""
            except TypeError:  # an int past 64 bits, a lone surrogate
                body = b""
            # json.dumps escapes everything outside printable ASCII (DEL included); orjson not
            if body and body.isascii() and b"\x7f" not in body:
                lines.append(prefix + body[1:])
            else:
                lines.append(self._format(record, {**common, **item}).encode())
        return b"\n".join(lines).decode()

    def _format(self, record: logging.LogRecord, fields: Mapping[str, Any]) -> str:
        when = datetime.fromtimestamp(record.created, tz=UTC)
        if self.as_json:
            line: dict[str, Any] = {
                "ts": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "level": record.levelname.lower(),
                "logger": record.name,
                "event": record.getMessage(),
            }
            line.update({k: _jsonable(v) for k, v in fields.items()})
            if exception := self._exception(record):
                line["exception"] = exception
            return json.dumps(line, separators=(",", ":"))
        text = " ".join(f"{printable(str(k))}={printable(str(_jsonable(v)))}"
                        for k, v in fields.items())
        out = f"{when:%H:%M:%S} {record.levelname:<7} {printable(record.getMessage())}"
        out = f"{out}  {text}" if text else out
        if exception := self._exception(record):
            # Indented: no line of a traceback (whose message may quote a value) reads as a record.
            out = "\n".join([out, *(f"  {printable(line)}" for line in exception.splitlines())])
        return out

    def _exception(self, record: logging.LogRecord) -> str | None:
        # A queued record carries its traceback as text already (QueuedStderrHandler.prepare).
        if record.exc_info:
            return self.formatException(record.exc_info)
        return record.exc_text or None


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes a record, all its lines, in one write (stderr is line-buffered: a write per
    line was a system call per line); the write releases the GIL meanwhile."""


class _Listener(QueueListener):
    def _monitor(self) -> None:
        leave_stop_signals_to_the_main_thread()
        super()._monitor()  # type: ignore[misc]

    def enqueue_sentinel(self) -> None:
        self.queue.put(self._sentinel)  # type: ignore[attr-defined]  # waits for room, never drops the stop


class QueuedStderrHandler(QueueHandler):
    """Puts records on a bounded queue; a QueueListener thread formats them with
    StructuredFormatter and writes them to stderr, in the order they were put.

    A full queue makes the caller wait, so memory stays flat however far the writer falls
    behind; `close()` (logging's shutdown at exit) writes everything still queued.
    """

    def __init__(self, fmt: str = "auto", backlog: int = 10_000) -> None:
        super().__init__(queue.Queue(maxsize=backlog))
        self._fmt, self._backlog = fmt, backlog
        self._start_listener()
        _QUEUED_HANDLERS.add(self)

    def _start_listener(self) -> None:
        stream = _StderrHandler()
        stream.setFormatter(StructuredFormatter(self._fmt))
        self.listener = _Listener(self.queue, stream)
        self.listener.start()

    def restart_after_fork(self) -> None:
        """A forked child (gunicorn's worker) has the queue but not the thread: a fresh queue
        and listener, so its records are written too."""
        self.queue = queue.Queue(maxsize=self._backlog)
        self._start_listener()

    def enqueue(self, record: logging.LogRecord) -> None:
        self.queue.put(record)  # type: ignore[attr-defined]

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """The record, safe to format later: message merged, traceback as text."""
        if not record.args and not record.exc_info:
            return record  # log_event's records: nothing to merge, no copy on the caller's path
        prepared = copy.copy(record)
        prepared.msg = record.getMessage()
        prepared.args = None
        if record.exc_info:
            prepared.exc_text = logging.Formatter().formatException(record.exc_info)
            prepared.exc_info = None
        return prepared

    def flush(self) -> None:
        """Wait until every record queued so far is written."""
        if self.listener._thread is not None:
            self.queue.join()  # type: ignore[attr-defined]

    def close(self) -> None:
        if self.listener._thread is not None:
            self.listener.stop()  # writes what is still queued, then ends the thread
        super().close()


_QUEUED_HANDLERS: "weakref.WeakSet[QueuedStderrHandler]" = weakref.WeakSet()


def _restart_listeners_in_child() -> None:
    for handler in list(_QUEUED_HANDLERS):
        handler.restart_after_fork()


os.register_at_fork(after_in_child=_restart_listeners_in_child)


class _WrittenThrough(io.TextIOBase):
    """A stream that hands each record's lines, once flushed, to `write` in one call (a
    progress bar's `tqdm.write`: one clear and redraw of the bar per record, not per line)."""

    def __init__(self, write: Callable[[str], object]) -> None:
        super().__init__()
        self._write = write
        self._pending: list[str] = []

    def write(self, text: str) -> int:
        self._pending.append(text)
        return len(text)

    def flush(self) -> None:
        if self._pending:
            text, self._pending = "".join(self._pending), []
            self._write(text)


@contextmanager
def lines_written_through(write: Callable[[str], object]) -> Iterator[None]:
    """While the block runs, the queued handlers' lines go to `write` instead of stderr (a
    progress bar writes them above itself: core.progress)."""
    writers = [h.listener.handlers[0] for h in list(_QUEUED_HANDLERS)
               if h.listener._thread is not None]  # not the closed ones
    streams = [w for w in writers if isinstance(w, logging.StreamHandler)]
    previous = [(w, w.setStream(_WrittenThrough(write))) for w in streams]
    try:
        yield
    finally:
        for writer, stream in previous:
            if stream is not None:
                writer.setStream(stream)


def flush_queued_handlers() -> None:
    """Wait until every queued handler has written the records queued so far."""
    for handler in list(_QUEUED_HANDLERS):
        handler.flush()  # a closed one has nothing left to write
