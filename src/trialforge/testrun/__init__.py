"""Run tests in a sandbox and read per-test outcomes the code under test cannot forge unseen.

``prepare`` (on the host, before the sandbox exists) rewrites the tree's test files: in a graded run
the expected values of the assertions the host can judge leave the sandbox (``blinding.blind``: the
sandbox only observes, the host compares), and in a validation run every such assertion is observed
as it runs (``blinding.instrument``, to calibrate); then it plants canary tests and hashes the
pristine test files. ``run_tests`` runs the task's runner (pytest or unittest, from its
``EnvSpec.test_cmd``, with the options ``command.py`` lets through and the ``EnvSpec.env`` it allows)
under the recorder (``recorder_program.py``), naming the tests to run in its key file, never on its
command line; ``report.read_report`` checks what came back. docs/verification.md has the threat model.
Validation, synthesis and grading all run tests through here: one protection for every verdict,
whichever runner a repository uses.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import random
import secrets
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from trialforge import pyast
from trialforge.envspec import EnvSpec, TestRunner, runner_args
from trialforge.sandbox.base import Limits, Sandbox
from trialforge.testrun.blinding import Blinding, FileAnalysis, analyse, blind, instrument
from trialforge.testrun.canaries import Canary, TestNames, plant
from trialforge.testrun.command import log_dropped, pytest_args, run_env, unittest_plan
from trialforge.testrun.report import TestReport, read_report

__all__ = [
    "REPORT_CAP_BYTES", "Canary", "Guard", "TestReport", "analyse_tests", "prepare", "report_limits", "run_tests",
]  # fmt: skip

RECORDER = (Path(__file__).with_name("recorder_program.py")).read_text(encoding="utf-8")
# The report channel carries about 0.9 KB per test (its phases, as observed and as reported): sandboxes that run
# tests keep this much output at least, room for about 70,000 tests (pypa/packaging's suite has 40,000-odd).
REPORT_CAP_BYTES = 64 << 20
OBSERVE_BYTES = 16 << 20  # of which observed values may take this much; past it a value reads as opaque
# A module that does not import is one collection error, not a run of nothing: the other modules still run.
PYTEST_ARGS = ["-p", "no:cacheprovider", "-q", "--tb=short", "-o", "addopts=", "--continue-on-collection-errors"]
Observe = Literal["off", "instrument", "blind"]


@dataclass(frozen=True)
class Guard:
    """What the host planted in a tree and what it knows of it: the run is checked against this."""

    canaries: tuple[Canary, ...] = ()
    # relative path -> sha256 of every Python file the diff under test did not change (None: the host
    # vouches for the whole tree): plugins registered during the run must come from one of them
    pristine: dict[str, str] | None = None
    test_files: tuple[str, ...] = ()  # the pristine test files: the audit hook lets their calls be
    extra_ids: tuple[str, ...] = field(default=())  # canary ids to add to an explicit test selection
    runner: TestRunner = "pytest"  # the runner the canaries were written for
    blinding: Blinding | None = None  # a graded run's: the host's checks and each renamed test's original id
    analyses: Mapping[str, FileAnalysis] = field(default_factory=dict)  # a validation run's instrumented files

    @property
    def must_fail(self) -> int:
        return sum(c.must == "fail" for c in self.canaries)


def prepare(
    tree: Path,
    test_ids: list[str],
    test_files: Iterable[str],
    *,
    changed: Iterable[str] = (),
    plant_in: list[str] | None = None,
    copy_from: list[str] | None = None,
    rng: random.Random | None = None,
    runner: TestRunner = "pytest",
    observe: Observe = "off",
    in_process: Iterable[str] = (),
    param_rows: Mapping[str, int] | None = None,
    recorded: Mapping[str, object] | None = None,
) -> Guard:
    """Rewrite and plant canaries in ``tree`` (the files of ``test_ids``, or ``plant_in``); hash what the diff
    left alone.

    ``test_files``: the tree's test files (relative paths; the diff's test-path edits were dropped).
    ``changed``: the files the diff under test changed (the agent's, or a gold patch being validated).
    ``copy_from``: the tests to make must-fail copies of (canaries.plant); a random one per file when None.
    ``runner``: the runner the tree's tests will run under (its loader decides what a canary must look like).
    ``observe``: ``blind`` the files of ``test_ids`` (grading: ``in_process``, ``param_rows`` and ``recorded`` come
    from the task's validation), ``instrument`` every test file (validation), or neither.
    """
    rng = rng or random.Random(secrets.randbits(64))
    files = list(test_files)
    names: dict[str, TestNames] = {}
    blinding: Blinding | None = None
    analyses: dict[str, FileAnalysis] = {}
    if observe == "blind":
        for rel, ids in _by_file(test_ids).items():
            analysis = _analysis(tree, rel, runner)
            if analysis is None:
                continue
            names[rel] = TestNames(analysis.module, rng)
            blinded = blind(analysis, ids, in_process, param_rows, names[rel].new, rng, recorded)
            if blinded is not None:
                (tree / rel).write_text(blinded[0], encoding="utf-8")
                blinding = blinded[1] if blinding is None else blinding.merged(blinded[1])
    elif observe == "instrument":
        for rel in files:
            analysis = _analysis(tree, rel, runner)
            rewritten = instrument(analysis) if analysis is not None else None
            if analysis is not None and rewritten is not None:
                (tree / rel).write_text(rewritten, encoding="utf-8")
                analyses[rel] = analysis
    sandbox_ids = blinding.sandbox_ids(test_ids) if blinding else list(test_ids)
    copies = None if copy_from is None else (blinding.sandbox_ids(copy_from) if blinding else copy_from)
    canaries = plant(tree, sandbox_ids, rng, files=plant_in, copy_from=copies, runner=runner, names=names)
    if observe == "blind":  # the planted files printed as one: no spacing or layout tells a planted test apart
        for rel in {c.file for c in canaries}:
            _reprint(tree / rel)
    skip = set(changed) - {c.file for c in canaries}
    hashes = {
        rel: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(tree.rglob("*.py"))
        if (rel := path.relative_to(tree).as_posix()) not in skip and path.is_file() and not path.is_symlink()
    }
    tests = tuple(sorted(rel for rel in {*files, *(c.file for c in canaries)} if rel in hashes))
    extra = tuple(c.node_id for c in canaries)
    return Guard(tuple(canaries), hashes, tests, extra, runner, blinding, analyses)


def analyse_tests(tree: Path, files: Iterable[str], runner: TestRunner = "pytest") -> dict[str, FileAnalysis]:
    """The tests of each of ``files`` (relative to ``tree``), as ``prepare(observe="instrument")`` finds them."""
    found = {}
    for rel in files:
        analysis = _analysis(tree, rel, runner)
        if analysis is not None and analysis.tests:
            found[rel] = analysis
    return found


def _reprint(path: Path) -> None:
    try:
        path.write_text(ast.unparse(pyast.parse(path.read_text(encoding="utf-8"))) + "\n", encoding="utf-8")
    except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
        return  # a file the host cannot print stays as planted (its tests could not have been blinded either)


def _by_file(test_ids: Iterable[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for test_id in test_ids:
        if "::" in test_id:
            found.setdefault(test_id.split("::", 1)[0], []).append(test_id)
    return found


def _analysis(tree: Path, rel: str, runner: TestRunner) -> FileAnalysis | None:
    path = tree / rel
    if not rel.endswith(".py") or not path.is_file() or path.is_symlink():
        return None
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return analyse(source, rel, runner)


def report_limits(limits: Limits) -> Limits:
    """``limits`` with room for the report channel of a large suite (a truncated report counts as none)."""
    return replace(limits, output_cap_bytes=max(limits.output_cap_bytes, REPORT_CAP_BYTES))


def run_tests(
    sandbox: Sandbox,
    test_ids: list[str] | None = None,
    *,
    timeout: float,
    guard: Guard | None = None,
    stop_early: bool = False,
    env: EnvSpec | None = None,
    cpu_s: float | None = None,
) -> TestReport:
    """Run ``test_ids`` (all tests when None) at /work in ``sandbox``; per-test outcomes and tamper evidence.

    ``env``: the task's environment spec: its ``test_cmd`` picks the runner and its options, its ``env``
    the variables (both as ``command.py`` allows); plain pytest when None.
    ``stop_early`` suits grading, where one failing test decides the reward: the run stops after the
    must-fail canaries' failures plus one (the remaining tests report as missing, which is no evidence).
    ``cpu_s``: the test process's budget of CPU-seconds (RLIMIT_CPU, set by the recorder before anything
    runs). Unlike ``timeout`` it does not stretch when the machine is loaded, so it can sit far closer to
    what an honest run uses: an edit that makes a loop endless is stopped in seconds, not at the wall limit.
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
        plan = unittest_plan(runner_args(env.test_cmd), named_tests=bool(test_ids))
        key["unittest"] = {**plan.for_recorder(), "select": selection, "maxfail": max_failures}
        dropped = plan.dropped
    else:
        options = pytest_args(runner_args(env.test_cmd), named_tests=bool(test_ids))
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
    report = read_report(result, marker, guard.canaries, graded, max_failures, guard.blinding, obs_marker)
    if cpu_s is not None and not report.reported and result.exit_code == 128 + signal.SIGXCPU:
        report = replace(report, cpu_exhausted=True)
    return report
