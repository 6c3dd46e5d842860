"""QueuedStderrHandler writes records on its listener thread, in order, all of them by
close(); the caller waits only when the queue is full; a failing record stops nothing."""

import json
import logging
import threading

import pytest

from core.logs import (
    QueuedStderrHandler,
    StructuredFormatter,
    flush_queued_handlers,
    lines_written_through,
    log_events,
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
