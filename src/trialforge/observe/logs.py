"""Structured logging: one JSON object per line, with the ``extra={...}`` fields a call site passes.

trialforge logs through ``logging`` with structured fields
(``log.info("published part", extra={"dataset": ..., "rows": ...})``); this formatter keeps those
fields as JSON keys so a log shipper or ``jq`` can filter on them. ``setup_logging`` installs it on
the root logger (``fmt="text"`` keeps a human format for terminals).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
_HANDLER_NAME = "trialforge"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry |= {key: value for key, value in record.__dict__.items() if key not in _STANDARD}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(
    level: int | str = logging.INFO, fmt: Literal["json", "text"] = "json", stream: TextIO | None = None
) -> logging.Handler:
    """Install (or replace) trialforge's handler on the root logger and return it; idempotent."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    return handler
