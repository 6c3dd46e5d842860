"""QueuedStderrHandler writes records on its listener thread, in order, all of them by
close(); the caller waits only when the queue is full; a failing record stops nothing.
Items given as Rows are written byte for byte as the same items as dicts."""

import json
import logging
import sys
import threading
import uuid
from datetime import UTC, date, datetime
from typing import Any

import pytest

from core.logs import (
    QueuedStderrHandler,
    Rows,
    StructuredFormatter,
    flush_queued_handlers,
    lines_written_through,
    log_events,
    printable,
)


class _RecordingFormatter(logging.Formatter):
    """Records which thread formats each message; the first one waits for `release`."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release
        self.seen: list[tuple[str, str]] = []

    def format(self, record: logging.LogRecord) -> str:
        if not self.seen:
            self.release.wait(timeout=10)
        if record.getMessage() == "boom":
            raise RuntimeError("boom")
        self.seen.append((record.getMessage(), threading.current_thread().name))
        return record.getMessage()


def _logger(handler: logging.Handler, name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_records_are_written_in_order_on_another_thread_and_close_waits_for_all(
    capsys: pytest.CaptureFixture[str],
) -> None:
    release = threading.Event()
    handler = QueuedStderrHandler(fmt="text", backlog=8)
    formatter = _RecordingFormatter(release)
    handler.listener.handlers[0].setFormatter(formatter)
    logger = _logger(handler, "tests.logs.order")

    logger.info("0")
    for n in range(1, 5):
        logger.info(str(n))
    assert formatter.seen == []  # the first record is still waiting, and nothing ran here
    release.set()
    for n in range(5, 100):  # more than the backlog: the caller waits for room
        logger.info(str(n))
    handler.close()

    assert [m for m, _ in formatter.seen] == [str(n) for n in range(100)]
    assert threading.current_thread().name not in {name for _, name in formatter.seen}
    assert capsys.readouterr().err.split() == [str(n) for n in range(100)]


def test_a_failing_record_does_not_stop_the_ones_after_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logging, "raiseExceptions", False)  # the handler's own error report
    release = threading.Event()
    release.set()
    handler = QueuedStderrHandler(fmt="text", backlog=1)
    formatter = _RecordingFormatter(release)
    handler.listener.handlers[0].setFormatter(formatter)
    logger = _logger(handler, "tests.logs.failing")

    logger.info("boom")
    for n in range(5):
        logger.info(str(n))
    handler.close()

    assert [m for m, _ in formatter.seen] == ["0", "1", "2", "3", "4"]
    assert capsys.readouterr().err.split() == ["0", "1", "2", "3", "4"]


def test_log_events_writes_one_json_line_per_item_from_one_record() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = _logger(Keep(), "tests.logs.items")
    log_events(logger, logging.INFO, "reminder queued",
               [{"document_id": "d1", "days_left": 3}, {"document_id": "d2", "days_left": 0}],
               run_id="r")

    [record] = records
    lines = [json.loads(line) for line in StructuredFormatter("json").format(record).splitlines()]
    assert [(x["event"], x["run_id"], x["document_id"], x["days_left"]) for x in lines] == [
        ("reminder queued", "r", "d1", 3), ("reminder queued", "r", "d2", 0)]


def test_lines_written_through_get_each_records_lines_in_one_call_and_then_stderr_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    handler = QueuedStderrHandler(fmt="json", backlog=8)
    logger = _logger(handler, "tests.logs.through")
    written: list[str] = []

    with lines_written_through(written.append):
        log_events(logger, logging.INFO, "item", [{"n": 1}, {"n": 2}])
        flush_queued_handlers()
    logger.info("after")
    handler.close()

    assert len(written) == 1 and [json.loads(line)["n"] for line in written[0].splitlines()] == [1, 2]
    assert [json.loads(line)["event"] for line in capsys.readouterr().err.splitlines()] == ["after"]


def _records(items: Any, **fields: Any) -> logging.LogRecord:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log_events(_logger(Keep(), "tests.logs.rows"), logging.INFO, "reminder queued", items,
               **fields)
    [record] = records
    return record


def test_rows_are_written_as_the_same_items_as_dicts_would_be_byte_for_byte() -> None:
    """The fast path (orjson from the rows) writes exactly what the general path writes,
    rows it cannot render alike included: non-ASCII, DEL and control characters, a float, an
    int past 64 bits, a lone surrogate, a date, a UUID, None and booleans."""
    keys = ("owner_user_id", "document_id", "type", "threshold_days", "days_left")
    owner = uuid.UUID("0190a0b0-0000-7000-8000-000000000001")
    rows: list[tuple[Any, ...]] = [
        (str(owner), "d1", "Passport", 30, 5, "totals", "past", "the keys"),
        (owner, "d2", "Паспорт", 7, -1),
        (str(owner), "d3", "tab\tnew\nline\x01\x7f\"\\/", 1, 0),
        (str(owner), "d4", None, True, 1.5),
        (str(owner), "d5", "big", 2**70, False),
        (str(owner), "d6", "\ud800", 0, 0),
        (str(owner), "d7", date(2026, 12, 1), 0, datetime(2026, 12, 1, tzinfo=UTC)),
    ]
    formatter = StructuredFormatter("json")
    record = _records(Rows(keys, rows), run_id=uuid.uuid4())
    as_rows = formatter.format(record)
    fields = record.fields  # type: ignore[attr-defined]
    record.fields = {**fields, "each": list(fields["each"])}  # the same items, as dicts
    as_dicts = formatter.format(record)

    assert as_rows.encode() == as_dicts.encode()
    assert len(as_rows.splitlines()) == len(rows)
    first = json.loads(as_rows.splitlines()[0])
    assert list(first) == ["ts", "level", "logger", "event", "run_id", *keys]
    assert json.loads(as_rows.splitlines()[1])["type"] == "Паспорт"


def test_rows_read_as_the_items_they_stand_for() -> None:
    rows = Rows(("a", "b"), [(1, "x", "ignored"), (2, "y")])

    assert list(rows) == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert rows[1] == {"a": 2, "b": "y"} and rows[:1] == [{"a": 1, "b": "x"}]
    assert "'b': 'y'" in repr(rows)


def test_a_field_of_the_record_that_a_row_also_names_takes_the_general_path() -> None:
    record = _records(Rows(("run_id", "n"), [("mine", 1)]), run_id="common")

    [line] = StructuredFormatter("json").format(record).splitlines()
    assert json.loads(line)["run_id"] == "mine"


def test_rows_in_text_format_are_a_line_each() -> None:
    record = _records(Rows(("document_id", "days_left"), [("d1", 3), ("d2", 0)]), run_id="r")

    lines = StructuredFormatter("text").format(record).splitlines()
    assert [line.rsplit("  ", 1)[1] for line in lines] == [
        "run_id=r document_id=d1 days_left=3", "run_id=r document_id=d2 days_left=0"]


def test_the_handler_writes_a_records_lines_in_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes: list[str] = []

    class Stream:
        def write(self, text: str) -> None:
            writes.append(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stream())
    handler = QueuedStderrHandler(fmt="json", backlog=2)
    logger = _logger(handler, "tests.logs.block")
    log_events(logger, logging.INFO, "reminder queued",
               Rows(("document_id",), [(f"d{n}",) for n in range(500)]), run_id="r")
    handler.close()

    [block] = writes
    assert [json.loads(line)["document_id"] for line in block.splitlines()] == [
        f"d{n}" for n in range(500)]
    assert block.endswith("\n")


def test_below_the_level_no_record_is_made() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = _logger(Keep(), "tests.logs.level")
    logger.setLevel(logging.WARNING)
    log_events(logger, logging.INFO, "reminder queued", Rows(("a",), [(1,)]))

    assert records == []


# A document type as an attacker would write it: a forged line, a screen clear, a colour.
FORGED_TYPE = "Passport\n03:00:00 ERROR   forged line\x1b[2J\x1b[31m\u202e"


def test_a_text_line_escapes_the_control_characters_of_every_value() -> None:
    record = logging.LogRecord("reminders", logging.INFO, __file__, 1,
                               "reminder queued for %s", (FORGED_TYPE,), None)
    record.fields = {"type": FORGED_TYPE, FORGED_TYPE: 1, "documents": [FORGED_TYPE]}
    try:
        raise ValueError(FORGED_TYPE)
    except ValueError:
        record.exc_info = sys.exc_info()

    text = StructuredFormatter("text").format(record)

    assert "\x1b" not in text and "\u202e" not in text
    first, *traceback = text.splitlines()
    assert "forged line" in first and "type=Passport\\n03:00:00 ERROR   forged line\\x1b[2J" in first
    assert traceback[0].startswith("  Traceback") and all(line.startswith("  ") for line in traceback)
    assert not any(line.startswith("03:00:00") for line in text.splitlines())
    assert printable("Visa") == "Visa" and printable("Visum ü é") == "Visum ü é"


def test_a_json_line_carries_the_value_escaped_and_reads_back_whole() -> None:
    record = _records(Rows(("type",), [(FORGED_TYPE,)]), run_id="r")
    line = StructuredFormatter("json").format(record)
    assert "\n" not in line and "\x1b" not in line
    assert json.loads(line)["type"] == FORGED_TYPE
