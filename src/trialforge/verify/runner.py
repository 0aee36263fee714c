"""Run named tests in a sandbox and read per-test outcomes from a report the code under test cannot easily forge.

pytest runs in-process with a small recorder plugin passed on the command line
(nothing on disk for an agent to edit). The recorder prints one JSON line after
a per-run random marker; the stdout summary ("N passed") is never parsed, and a
run that dies early (``os._exit``) simply has no report, which grades as failure.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Literal

from trialforge.sandbox.base import ExecResult, Sandbox

Outcome = Literal["passed", "failed", "error", "skipped", "missing"]

RECORDER = r"""
import json, os, sys
marker = os.environ.pop("TF_REPORT_MARKER")
import pytest
class Recorder:
    def __init__(self):
        self.outcomes = {}
    def pytest_runtest_logreport(self, report):
        prev = self.outcomes.get(report.nodeid)
        if report.when == "call":
            outcome = "skipped" if report.skipped else report.outcome
        elif report.failed:
            outcome = "error"
        elif report.skipped:
            outcome = "skipped"
        else:
            outcome = prev or "passed"
        if prev in ("error", "failed") and outcome == "passed":
            outcome = prev
        self.outcomes[report.nodeid] = outcome
    def pytest_collectreport(self, report):
        if report.failed:
            self.outcomes["<collection>:" + (report.nodeid or ".")] = "error"
recorder = Recorder()
code = pytest.main(sys.argv[1:], plugins=[recorder])
sys.stdout.flush()
sys.stdout.write("\n" + marker + json.dumps({"exit": int(code), "tests": recorder.outcomes}) + "\n")
sys.stdout.flush()
"""

PYTEST_ARGS = ["-p", "no:cacheprovider", "-q", "--tb=short", "-o", "addopts="]


@dataclass(frozen=True)
class TestReport:
    exit_code: int  # pytest's own exit code (-1 when no report came back)
    outcomes: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    timed_out: bool = False
    reported: bool = True
    log_tail: str = ""

    def outcome(self, test_id: str) -> Outcome:
        return self.outcomes.get(test_id, "missing")  # type: ignore[return-value]

    def all_passed(self, test_ids: list[str]) -> bool:
        return self.reported and all(self.outcome(t) == "passed" for t in test_ids)


def run_tests(
    sandbox: Sandbox, test_ids: list[str] | None = None, *, timeout: float, stop_at_first_failure: bool = False
) -> TestReport:
    """Run ``test_ids`` (all tests when None) in ``sandbox`` at /work and return per-test outcomes.

    ``stop_at_first_failure`` suits grading, where one failure decides the reward: the
    remaining tests then report as missing.
    """
    marker = f"@@trialforge-report-{secrets.token_hex(16)}@@"
    argv = ["python3", "-c", RECORDER, *PYTEST_ARGS, *(["-x"] if stop_at_first_failure else []), *(test_ids or [])]
    result = sandbox.exec(argv, timeout=timeout, env={"TF_REPORT_MARKER": marker})
    return parse_report(result, marker)


def parse_report(result: ExecResult, marker: str) -> TestReport:
    """The one report line after ``marker``; anything else printed is only a log.

    Exactly one marker must appear: a second one means something in the process
    printed a report of its own, and then neither can be trusted.
    """
    head, sep, tail = result.stdout.rpartition(marker)
    log_tail = (head[-4000:] + result.stderr[-2000:]).strip()
    if not sep or result.stdout.count(marker) != 1:
        if sep:
            log_tail = "more than one report marker: the run's report was forged or duplicated\n" + log_tail
        return TestReport(-1, {}, result.duration_s, result.timed_out, reported=False, log_tail=log_tail)
    try:
        data = json.loads(tail.strip().splitlines()[0])
        outcomes = {str(k): str(v) for k, v in data["tests"].items()}
        exit_code = int(data["exit"])
    except (ValueError, KeyError, IndexError, TypeError):
        return TestReport(-1, {}, result.duration_s, result.timed_out, reported=False, log_tail=log_tail)
    if result.exit_code != 0 and exit_code == 0:
        exit_code = result.exit_code  # the process died after pytest finished: do not trust the report
    return TestReport(exit_code, outcomes, result.duration_s, result.timed_out, reported=True, log_tail=log_tail)
