"""Running tests in a sandbox under the recorder and reading back per-test outcomes: ``run_tests``.

The task's runner (pytest or unittest, from its ``EnvSpec.test_cmd``, with the options ``command`` lets through
and the ``EnvSpec.env`` it allows) runs under the recorder (``recorder_program.py``), which is told the tests to
run in its key file, never on its command line; ``report.read_report`` checks what came back against the
``Guard`` that ``prepare`` made.
"""

from __future__ import annotations

import json
import math
import secrets
import signal
from dataclasses import replace
from pathlib import Path

from trialforge.envspec import EnvSpec, runner_args
from trialforge.sandbox.base import Limits, Sandbox
from trialforge.testrun.command import log_dropped, pytest_args, run_env, unittest_plan
from trialforge.testrun.prepare import Guard
from trialforge.testrun.report import TestReport, read_report

RECORDER = (Path(__file__).with_name("recorder_program.py")).read_text(encoding="utf-8")
# The report channel carries about 0.9 KB per test (its phases, as observed and as reported): sandboxes that run
# tests keep this much output at least, room for about 70,000 tests (pypa/packaging's suite has 40,000-odd).
REPORT_CAP_BYTES = 64 << 20
OBSERVE_BYTES = 16 << 20  # of which observed values may take this much; past it a value reads as opaque
# A module that does not import is one collection error, not a run of nothing: the other modules still run.
PYTEST_ARGS = ["-p", "no:cacheprovider", "-q", "--tb=short", "-o", "addopts=", "--continue-on-collection-errors"]


def report_limits(limits: Limits) -> Limits:
    """``limits`` with room for the report channel of a large suite (a truncated report counts as none)."""
    return limits.model_copy(update={"output_cap_bytes": max(limits.output_cap_bytes, REPORT_CAP_BYTES)})


def run_tests(
    sandbox: Sandbox,
    test_ids: list[str] | None = None,
    *,
    timeout: float,
    guard: Guard | None = None,
    stop_early: bool = False,
    env: EnvSpec | None = None,
    cpu_s: float | None = None,
    keep_selection: bool = False,
) -> TestReport:
    """Run ``test_ids`` (all tests when None) at /work in ``sandbox``; per-test outcomes and tamper evidence.

    ``env``: the task's environment spec: its ``test_cmd`` picks the runner and its options, its ``env``
    the variables (both as ``command.py`` allows); plain pytest when None.
    ``stop_early`` suits grading, where one failing test decides the reward: the run stops after the
    must-fail canaries' failures plus one (the remaining tests report as missing, which is no evidence).
    ``cpu_s``: the test process's budget of CPU-seconds (RLIMIT_CPU, set by the recorder before anything
    runs). Unlike ``timeout`` it does not stretch when the machine is loaded, so it can sit far closer to
    what an honest run uses: an edit that makes a loop endless is stopped in seconds, not at the wall limit.
    ``keep_selection``: ``test_ids`` are whole modules standing for a whole-suite run (validation's rerun of a
    stopped run, one module at a time): the task's selection options still apply and the run is read as that suite
    run is (a canary the task's -k leaves out is no evidence), never as one whose tests the host named.
    """
    guard = guard or Guard()
    env = env or EnvSpec()
    runner = env.runner
    if guard.canaries and guard.runner != runner:
        raise ValueError(
            f"canaries were planted for {guard.runner}, but the run uses {runner}: pass runner= to prepare"
        )
    marker, obs_marker = secrets.token_hex(24), secrets.token_hex(24)
    key_path = f"/work/.tf-key-{secrets.token_hex(8)}"
    graded = guard.blinding.sandbox_ids(test_ids or ()) if guard.blinding else list(test_ids or ())
    whole_files = {t for t in graded if "::" not in t}  # their canaries run with them: never twice
    extra = [c for c in guard.extra_ids if c.split("::", 1)[0] not in whole_files]
    selection = [*graded, *extra] if graded else []
    max_failures = guard.must_fail + 1 if stop_early else None
    key: dict[str, object] = {"marker": marker, "pristine": guard.pristine, "tests": guard.test_files, "runner": runner}
    key |= {"obs_marker": obs_marker, "observe_bytes": OBSERVE_BYTES}
    if guard.analyses:
        key["rows"] = True  # which parametrize row each test is: calibration reads each row's expected values
    if cpu_s is not None:
        key["cpu_s"] = max(1, math.ceil(cpu_s))
    argv = ["python3", "-s", "-c", RECORDER, key_path]
    if runner == "unittest":
        plan = unittest_plan(runner_args(env.test_cmd), named_tests=bool(test_ids), keep_selection=keep_selection)
        key["unittest"] = {**plan.for_recorder(), "select": selection, "maxfail": max_failures}
        dropped = plan.dropped
    else:
        options = pytest_args(runner_args(env.test_cmd), named_tests=bool(test_ids), keep_selection=keep_selection)
        key |= {"select": selection, "maxfail": max_failures}  # never the command line: only the files go there
        # in the order the host named them: pytest runs files in that order, and suites can depend on it (a session
        # fixture that an earlier test module's autouse fixture fills for later doctests, say)
        files = list(dict.fromkeys(t.split("::", 1)[0] for t in selection))
        argv += [*options.args, *PYTEST_ARGS, *files]  # ours after the task's: ours win
        dropped = options.dropped
    variables, refused = run_env(env.env)
    log_dropped(f"test command {' '.join(env.test_cmd)!r}", dropped)
    log_dropped("test environment", refused)
    sandbox.write_file(key_path.removeprefix("/work/"), json.dumps(key).encode())
    result = sandbox.exec(argv, timeout=timeout, env=variables or None)
    selected = [] if keep_selection else graded
    report = read_report(result, marker, guard.canaries, selected, max_failures, guard.blinding, obs_marker)
    if cpu_s is not None and not report.reported and result.exit_code == 128 + signal.SIGXCPU:
        report = replace(report, cpu_exhausted=True)
    return report
