"""Run the `trialforge` command in-process, as a user would type it."""

from __future__ import annotations

import logging
import os

from click.testing import Result
from typer.testing import CliRunner

from trialforge.cli import app


def invoke(*args: str) -> Result:
    """``trialforge ARGS``. The command installs a log handler on the root logger and sets variables for the
    processes it starts: both are put back after, so a later test sees neither."""
    root = logging.getLogger()
    handlers, level, environ = list(root.handlers), root.level, dict(os.environ)
    try:
        return CliRunner().invoke(app, list(args))
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for key in os.environ.keys() - environ.keys():
            del os.environ[key]
