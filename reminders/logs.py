"""Structured logging: one JSON object per line under a supervisor, readable text on a terminal.

Log calls name an event and pass its fields; the formatter decides the shape.
Fields never carry personal data: callers pass ids, types, thresholds and counts
only (the number mask and the payload never reach a logger).
"""

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

_FIELDS = "fields"


def log_event(
    logger: logging.Logger, level: int, event: str, *, exc_info: bool = False, **fields: Any
) -> None:
    """Log `event` with structured `fields` (ids, counts, thresholds; never PII)."""
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={_FIELDS: fields}, exc_info=exc_info, stacklevel=2)


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
        fields: dict[str, Any] = getattr(record, _FIELDS, {})
        when = datetime.fromtimestamp(record.created, tz=UTC)
        if self.as_json:
            line: dict[str, Any] = {
                "ts": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "level": record.levelname.lower(),
                "logger": record.name,
                "event": record.getMessage(),
            }
            line.update({k: _jsonable(v) for k, v in fields.items()})
            if record.exc_info:
                line["exception"] = self.formatException(record.exc_info)
            return json.dumps(line, separators=(",", ":"))
        text = " ".join(f"{k}={_jsonable(v)}" for k, v in fields.items())
        out = f"{when:%H:%M:%S} {record.levelname:<7} {record.getMessage()}"
        out = f"{out}  {text}" if text else out
        if record.exc_info:
            out = f"{out}\n{self.formatException(record.exc_info)}"
        return out
