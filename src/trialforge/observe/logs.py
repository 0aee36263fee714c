"""What a trialforge command shows, decided in one place: quiet for people, structured JSON for machines.

trialforge logs through ``logging`` with structured fields (``extra={"dataset": ..., "rows": ...}``) that
``JsonFormatter`` keeps as JSON keys. ``configure`` is called once per command (the CLI's ``-v``/``--log-format``,
or ``TRIALFORGE_VERBOSE``/``TRIALFORGE_LOG_FORMAT`` for ``dvc repro``'s stages): by default the terminal gets warnings,
errors and each stage's closing line; ``-v`` adds every INFO line, ``-vv`` DEBUG. Only the terminal is filtered:
Prefect's loggers keep INFO for its UI, and processes the command starts get the same terminal level through
``PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL`` unless it is set. What each level shows: docs/orchestration.md,
"Logs: what the terminal shows".
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TextIO, TypeVar

from trialforge.errors import TrialforgeError

if TYPE_CHECKING:
    from trialforge.funnel import Funnel

# Attributes every LogRecord has; anything else on a record came from ``extra`` (or, named ``_...``, from a
# library's record factory: Ray adds ``_ray_timestamp_ns`` to every record once imported).
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
_HANDLER_NAME = "trialforge"
STAGE_LOGGER = "trialforge.stage"  # the one line per stage that a quiet terminal still shows

LogFormat = Literal["json", "text"]
T = TypeVar("T")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry |= {key: value for key, value in record.__dict__.items() if key not in _STANDARD and key[0] != "_"}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``LEVEL logger: message`` for a person; a stage line is its message alone. A trialforge error logged with
    its traceback (Prefect logs every failed flow and task run so) shows its message alone unless ``tracebacks``:
    it says what was wrong, and the traceback only buries that."""

    def __init__(self, tracebacks: bool = True) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        if record.name == STAGE_LOGGER and record.levelno == logging.INFO:
            return record.getMessage()
        if not self.tracebacks and record.exc_info and isinstance(record.exc_info[1], TrialforgeError):
            record = logging.makeLogRecord(record.__dict__ | {"exc_info": None, "exc_text": None})
        return super().format(record)


class ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes: rich's progress view swaps it for a proxy that
    prints lines above its bars, and a test runner swaps it to capture a command's output.

    (Prefect's logging setup leaves the root logger alone when it already has a handler like this one.)
    """

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def _quiet(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or record.name == STAGE_LOGGER


def setup_logging(
    level: int | str = logging.INFO, fmt: LogFormat = "json", stream: TextIO | None = None, *, quiet: bool = False
) -> logging.Handler:
    """Install (or replace) trialforge's handler on the root logger and return it; idempotent.

    ``stream`` None: the current ``sys.stderr`` at each record. ``quiet``: below WARNING only the stage lines
    pass, whatever the level of the logger that made a record (Prefect's and Ray's are INFO on their own).
    Text shows a trialforge error's traceback at DEBUG only.
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME or _is_prefect_console(h)]:
        root.removeHandler(old)  # Prefect's: imported first, it put its console there; every line would show twice
    handler = logging.StreamHandler(stream) if stream is not None else ConsoleHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(tracebacks=_level(level) <= logging.DEBUG))
    if quiet:
        handler.addFilter(_quiet)
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def _level(level: int | str) -> int:
    return level if isinstance(level, int) else logging.getLevelNamesMapping()[level.upper()]


def _is_prefect_console(handler: logging.Handler) -> bool:
    return type(handler).__module__.startswith("prefect.") and type(handler).__name__ == "PrefectConsoleHandler"


def configure(verbose: int = 0, fmt: LogFormat = "text") -> logging.Handler:
    """The terminal of this command and of the processes it starts: ``verbose`` 0 quiet, 1 INFO, 2+ DEBUG."""
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", logging.getLevelName(level))
    logging.getLogger(STAGE_LOGGER).setLevel(logging.INFO)
    return setup_logging(level, fmt, quiet=verbose <= 0)


# --- the stage lines --------------------------------------------------------------------------------


def stage_done(stage: str, summary: str, *, started: float, **fields: Any) -> None:
    """Log the line a stage shows when it ends; ``started`` is ``time.monotonic()`` when it began."""
    seconds = round(time.monotonic() - started, 1)
    extra = {"stage": stage, "seconds": seconds, **fields}
    logging.getLogger(STAGE_LOGGER).info("%s: %s (%.1fs)", stage, summary, seconds, extra=extra)


def counted(counts: Mapping[str, int]) -> str:
    """``ok 9, env_error 1``: most first."""
    return ", ".join(f"{key} {n}" for key, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def rollout_done(iteration: int, final: bool, statuses: list[Mapping[str, int]], *, started: float) -> None:
    """The line of an iteration's rollout: its episodes by status (``statuses``: each shard's); ``final``: the
    held-out evaluation after the last update."""
    total: Counter[str] = sum((Counter(s) for s in statuses), Counter())
    said = f"{total.total()} episodes: {counted(total)}" if total else "no new episodes"
    name = f"rollout {iteration}" + (" (held-out eval)" if final else "")
    stage_done(name, said, started=started, statuses=dict(total))


def train_done(iteration: int, stats: Mapping[str, Any] | None, resumed: bool, *, started: float) -> None:
    """The line of an iteration's update: trained, or skipped (the reasons are logged as errors before it)."""
    decision = (stats or {}).get("decision", "no learner among the policies")
    stage_done(f"train {iteration}", decision + (" (taken before)" if resumed else ""), started=started)


def taskset_done(tasks: int, version: str, *, started: float) -> None:
    stage_done("task set", f"{tasks} tasks published as {version}", started=started, version=version)


def logged_step(step: Callable[..., tuple[T, Funnel]], *args: Any) -> tuple[T, Funnel]:
    """``step(*args)``, a task step that returns its output and its funnel, and then its stage line: how many
    tasks it kept of how many it saw, and why it dropped the others."""
    started = time.monotonic()
    out, funnel = step(*args)
    dropped = f"; dropped {counted(funnel.dropped)}" if funnel.dropped else ""
    fields = {"seen": funnel.seen, "kept": funnel.kept, "dropped": dict(funnel.dropped)}
    stage_done(funnel.stage, f"kept {funnel.kept} of {funnel.seen} tasks{dropped}", started=started, **fields)
    return out, funnel
