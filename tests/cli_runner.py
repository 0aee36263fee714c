"""Run the `trialforge` command in-process, as a user would type it."""

from __future__ import annotations

import logging

from click.testing import Result
from typer.testing import CliRunner

from trialforge.cli import app


def invoke(*args: str) -> Result:
    """``trialforge ARGS``. The command installs a log handler on the runner's stderr, which the runner closes:
    the root logger's handlers are put back after, or later tests' logs would hit a closed file."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return CliRunner().invoke(app, list(args))
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
