"""Validate a task by execution: its tests must fail before the fix and pass after it, every time.

Each configuration (base + test patch, then + gold patch) runs the whole suite ``runs`` times in a fresh sandbox,
with canaries (``trialforge.testrun``) and the task's runner, options and environment. Fail-to-pass and pass-to-pass
come from what happened; a test whose outcome changes between runs is flaky (quarantined if pass-to-pass, fatal if
the task depends on it), and a test id that some run of a tree does not report, or that only one tree reports while
its module ran in both, is unstable (a clock, a uuid or a directory listing in its parameters): in neither list,
since grading asks for ids by name. A test a run never reported (it stopped early, or left the test out) is unknown
to that run, never failed: fail-to-pass needs every before-run that reported it to say it did not pass, every after-run
to say it passed; a run that crashed or that pytest stopped early runs again one module at a time. Runs of a tree
already validated in the batch are reused. The first run of the fixed tree measures the suite, with
``validate.max_duration_s`` to run in (past it: ``suite_too_slow``); every other run gets the task's own limit, sized
to that time (``ValidateConfig.limit_for``). A rejection's reason is a short key (what ``record_verdicts`` counts by),
then the detail. A valid task's statement is settled from the runs before the fix (``tasks.observed``). Rules:
docs/pipeline.md, "Validation".
"""

from __future__ import annotations

import hashlib
import random
import re
import secrets
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from trialforge.envspec import EnvSpec
from trialforge.errors import PatchError
from trialforge.funnel import Funnel
from trialforge.memo import OncePerKey
from trialforge.sandbox.base import Backend, Limits, Sandbox, SandboxSpec
from trialforge.scratch import scratch_dir
from trialforge.tasks.calibration import calibrate, recorded_tests
from trialforge.tasks.envdetect.decide import OVERRIDE_FILE
from trialforge.tasks.extbuild import BuildFailed, build_tree
from trialforge.tasks.observed import settle_statement
from trialforge.tasks.patches import apply_patch, is_test_module, test_files, touched_paths
from trialforge.tasks.pytestconfig import python_files_of
from trialforge.tasks.schema import HostJudged, Task, Validation
from trialforge.tasks.settings import ValidateConfig
from trialforge.tasks.snapshots import SnapshotStore, tree_digest
from trialforge.tasks.visible import WorkspaceText
from trialforge.testrun.baseline import rejection
from trialforge.testrun.prepare import Guard, analyse_tests, prepare
from trialforge.testrun.report import COLLECTION, OVERFLOWED, RAN, TestReport
from trialforge.testrun.run import REPORT_CAP_BYTES, report_limits, run_tests

# Canaries are drawn from this and the tree: the same for one tree within a process (its runs are shared),
# unknowable from inside a sandbox.
_SALT = secrets.token_bytes(16)
CANARY_FILES = 2  # test modules that get canaries when the test patch names none
REASON_LINES = 3  # distinct error lines a rejection quotes
REASON_LINE_CAP = 160
REASON_CAP = 500
UNSTABLE_EXAMPLES = 10  # unstable ids the validation record quotes (a uuid-parametrized test makes new ones each run)
_COMPILE_ERROR = re.compile(r"^(?:SyntaxError|IndentationError|TabError)\b")  # a module that cannot compile
_FATAL = re.compile(r"Fatal Python error: (.*)$", re.MULTILINE)  # faulthandler's first line: the interpreter died
_INTERNAL = re.compile(r"^INTERNALERROR> (\w+(?:Error|Exception|Interrupt)\b.*)$", re.MULTILINE)  # pytest's own
_MISSING = "canary_missing:"  # what a run that stopped early shows of the canaries after its stop
_ERROR_LINE = re.compile(r"^(?:E\s+)?([\w.]*(?:Error|Exception|Exit)\b.*)$")


class SuiteRuns(OncePerKey[list[TestReport]]):
    """Suite runs by tree content and how they were run, shared by the validations of one batch.

    Runs whose tests did not report (a timeout, a crashed sandbox) are handed to whoever
    waited but not kept, so that one transient failure does not reject every task sharing the tree.
    """

    def __init__(self) -> None:
        super().__init__(keep=lambda reports: all(r.reported for r in reports))


def validate_task(
    task: Task,
    backend: Backend,
    image: str,
    snapshots: SnapshotStore,
    limits: Limits,
    cfg: ValidateConfig,
    shared: SuiteRuns | None = None,
) -> Task:
    """Return ``task`` with its test lists and validation record filled in (``validation.valid`` says the verdict).

    With ``shared``, a tree's suite runs are taken from (and given to) the other validations of the batch.
    """
    start = time.monotonic()
    with scratch_dir("validate") as tmp:
        try:
            before, after = _trees(task, snapshots, Path(tmp))
        except PatchError as exc:
            return _verdict(task, False, f"patch_does_not_apply: {exc}", 0, start)
        collected = python_files_of(after)
        touched = [p for p in touched_paths(task.test_patch) if is_test_module(p, collected)]
        episode = snapshots.materialize(task.snapshot)  # the workspace as the policy first sees it
        changed = touched_paths(task.test_patch)
        # a synthesized task's statement is a draft here, written again from this validation hiding every judged value
        statement = "" if task.source.kind == "synthetic" else task.problem_statement
        workspace = WorkspaceText.of(before, touched, episode, changed, statement)  # what the policy can read
        env = task.env or EnvSpec()
        unbuilt = Path(tmp) / "unbuilt"
        if env.build is not None:  # the repository's own extensions, compiled in each tree as its tests will see it
            shutil.copytree(before, unbuilt, symlinks=True)
            for tree, when in ((before, "before_fix"), (after, "after_fix")):
                try:
                    build_tree(backend, image, tree, env.build, report_limits(limits), "validate-build")
                except BuildFailed as exc:
                    return _verdict(task, False, f"build_failed_{when}: {exc}", 0, start)
        analyses = analyse_tests(after, test_files(after), env.runner)  # before the runs rewrite the tree
        runs_after = _runs(backend, image, after, limits, cfg, shared, touched, env, observe=True)  # measures
        if runs_after[0].timed_out:
            return _verdict(task, False, _too_slow(cfg), len(runs_after), start)
        limit = cfg.limit_for(runs_after[0].duration_s)
        runs_before = _runs(backend, image, before, limits, cfg, shared, touched, env, observe=True, limit=limit)
        validated = _judge(task, runs_before, runs_after, start, touched)
        if validated.validation.valid and (
            why := _fallback_passes(backend, image, unbuilt, limits, cfg, touched, env, validated.fail_to_pass, limit)
        ):
            return _verdict(task, False, why, cfg.runs, start)
        if not validated.validation.valid:
            return validated
        proof: list[TestReport] = []
        f2p, p2p = validated.fail_to_pass, validated.pass_to_pass
        chosen = recorded_tests(analyses, [*f2p, *p2p])
        if chosen:
            # the tests holding recorded expectations alone, in another order: what a graded run can reproduce
            _, fresh = _trees(task, snapshots, Path(tmp) / "proof")
            proof = _runs(backend, image, fresh, limits, cfg, shared, touched, env, observe=True, select=chosen,
                          limit=limit)  # fmt: skip
        host_judged = calibrate(analyses, runs_after, f2p, p2p, proof, before=runs_before, workspace=workspace)
        if host_judged.recorded and _effects_hidden(task, snapshots, Path(tmp) / "effects", backend, image, limits,
                                                    limit, env, host_judged, [*f2p, *p2p]):  # fmt: skip
            hidden = set(host_judged.recorded)
            host_judged = calibrate(analyses, runs_after, f2p, p2p, proof, before=runs_before, hidden=hidden,
                                    workspace=workspace)  # fmt: skip
    validated.validation.host_judged = host_judged
    return settle_statement(validated, runs_before, analyses)


def _effects_hidden(
    task: Task,
    snapshots: SnapshotStore,
    root: Path,
    backend: Backend,
    image: str,
    limits: Limits,
    limit: float,
    env: EnvSpec,
    record: HostJudged,
    tests: list[str],
) -> bool:
    """Whether taking the recorded expected sides out of the graded tests changes what they do on the unfixed tree.

    A recorded side is taken out of a graded test as a value computed alike before and after the fix; its effects go
    with it: ``assert item == make("a"); assert log() == []`` passed with ``make`` unfixed, its logging never run (the
    branches red team). So the graded tests run twice on the unfixed tree, blinded as grading blinds them, once
    without the recorded sides and once with them run where they stood: any test whose observations or outcome
    differ between the two lost an effect of the code under repair, and the recorded slots stay in process."""
    reports = []
    for run_recorded in (False, True):
        tree, _ = _trees(task, snapshots, root / ("with" if run_recorded else "without"))
        try:
            if env.build is not None:
                build_tree(backend, image, tree, env.build, report_limits(limits), "validate-build")
        except BuildFailed:
            return True
        guard = prepare(tree, tests, test_files(tree), copy_from=[], rng=random.Random(0), runner=env.runner,
                        observe="blind", in_process=record.in_process, param_rows=record.param_rows,
                        recorded=record.recorded, run_recorded=run_recorded)  # fmt: skip
        room = 2 * limit + limits.episode_timeout_s  # the reaper's deadline: room for the run's whole limit
        spec = SandboxSpec(image, tree, report_limits(limits), labels={"purpose": "validate"}, lifetime_s=room)
        sandbox = backend.create(spec)
        try:
            reports.append(run_tests(sandbox, tests, timeout=limit, guard=guard, env=env))
        finally:
            sandbox.close()
    without, ran = reports
    if not (without.reported and ran.reported):
        return True
    return any(
        without.observations.get(t) != ran.observations.get(t) or without.outcomes.get(t) != ran.outcomes.get(t)
        for t in tests
    )


def _too_slow(cfg: ValidateConfig) -> str:
    """The reason of a task whose fixed tree's suite outran ``max_duration_s``: the repository's suite is the cause
    (or a test the fix leaves hanging), not its commit."""
    return (
        f"suite_too_slow: the suite's first run with the fix did not finish in validate.max_duration_s "
        f"({cfg.max_duration_s:g}s): a suite this slow cannot be validated or graded under that limit"
    )


def _fallback_passes(
    backend: Backend,
    image: str,
    tree: Path,
    limits: Limits,
    cfg: ValidateConfig,
    touched: list[str],
    env: EnvSpec,
    fail_to_pass: list[str],
    limit: float,
) -> str:
    """Why the task cannot be graded ("" if it can): fail-to-pass tests that pass on the unfixed ``tree`` with its
    extensions not built. Such a test's failure was the compiled code's alone while the package falls back to right
    Python without it: a diff that keeps the module from loading (its init raising, a flag, ``__init__.py`` importing
    the fallback) would pass it with the bug in place. A task without extensions: ""."""
    if env.build is None:
        return ""
    (report,) = _runs(backend, image, tree, limits, cfg, None, touched, env, select=fail_to_pass, limit=limit)
    passing = [t for t in fail_to_pass if report.outcome(t) == "passed"]
    if not passing:
        return ""
    return (
        f"fail_to_pass_without_extension: {len(passing)} of {len(fail_to_pass)} pass before the fix when the "
        f"extensions are not built (a fallback runs: a diff that stops them loading would pass), e.g. {passing[0]}"
    )


def _trees(task: Task, snapshots: SnapshotStore, root: Path) -> tuple[Path, Path]:
    """The task's base tree with its test patch, and a copy with its gold patch too, under ``root``."""
    before, after = root / "before", root / "after"
    shutil.copytree(snapshots.materialize(task.snapshot), before, symlinks=True)
    if task.test_patch:
        apply_patch(before, task.test_patch)
    shutil.copytree(before, after, symlinks=True)
    apply_patch(after, task.gold_patch)
    return before, after


def _runs(
    backend: Backend,
    image: str,
    tree: Path,
    limits: Limits,
    cfg: ValidateConfig,
    shared: SuiteRuns | None,
    touched: list[str],
    env: EnvSpec,
    *,
    observe: bool = False,
    select: list[str] | None = None,
    limit: float | None = None,
) -> list[TestReport]:
    """The suite's runs on ``tree`` (``touched``: the test patch's test modules, where canaries go).

    Every file of the tree counts as the task's own for plugin provenance (the runs of one fixed tree
    are shared by every task fixed by it); the canaries and the other runtime checks judge the fix.
    ``observe``: every assertion the host could judge reports its value (the fixed tree's runs: ``calibrate``).
    ``select``: run only these tests, in this order, once (the proof run of recorded expectations).
    ``limit``: each run's time limit; None: the first run measures the suite (``_run``).
    """
    measures = limit is None  # a measuring run's timeout means the suite is too slow: never another run's timeout
    key = f"{tree_digest(tree)}|{touched}|{image}|{limits!r}|{cfg!r}|{env.model_dump_json()}|{observe}|{select}"
    key += f"|{measures}"
    rng = random.Random(hashlib.sha256(_SALT + key.encode()).digest())
    tests = test_files(tree)
    collected = python_files_of(tree)
    modules = touched or [p for p in tests if is_test_module(p, collected)]
    plant_in = modules if touched else rng.sample(modules, min(CANARY_FILES, len(modules)))
    mode = "instrument" if observe else "off"
    # No must-fail copies here: a copy's changed constant may be what the unfixed code returns (a good task rejected
    # as tampered), and nothing in these runs is the policy's; the self-contained canaries and the other layers stay.
    guard = prepare(tree, [], tests, plant_in=plant_in, copy_from=[], rng=rng, runner=env.runner, observe=mode)
    every = [p for p in tests if is_test_module(p, collected)]

    def run() -> list[TestReport]:
        return _run(backend, image, tree, limits, cfg, guard, env, every, select, limit)

    return run() if shared is None else shared.get(key, run)


def _run(
    backend: Backend,
    image: str,
    tree: Path,
    limits: Limits,
    cfg: ValidateConfig,
    guard: Guard,
    env: EnvSpec,
    modules: list[str],
    select: list[str] | None = None,
    limit: float | None = None,
) -> list[TestReport]:
    """``limit`` None: the first run measures the suite with ``cfg.max_duration_s`` to run in, and the later ones get
    ``cfg.limit_for`` its time; one that timed out is the only run (another would wait as long)."""
    times = 1 if select else cfg.runs  # the proof run of recorded expectations runs once
    # the reaper removes a sandbox past its deadline, its owner alive or not: room for every run's whole limit
    room = (times + 1) * (limit or cfg.max_duration_s) + limits.episode_timeout_s
    spec = SandboxSpec(image, tree, report_limits(limits), labels={"purpose": "validate"}, lifetime_s=room)
    sandbox = backend.create(spec)
    try:
        reports = []
        for _ in range(times):
            report = run_tests(sandbox, select, timeout=limit or cfg.max_duration_s, guard=guard, env=env)
            if limit is None and report.timed_out:
                return [report]
            limit = limit or cfg.limit_for(report.duration_s)
            fatal = _crashed(report)
            if not select and (ended := f"Fatal Python error: {fatal}" if fatal else _stopped(report)):
                report = _isolated(sandbox, modules, limit, guard, env, ended) or report
            reports.append(report)
        return reports
    finally:
        sandbox.close()


def _crashed(report: TestReport) -> str:
    """The fatal error that killed a run's interpreter (an extension module's segfault, as the runner's
    faulthandler printed it), or "": a crash is no tampering, and says nothing of the other tests."""
    if report.reported or report.timed_out or report.cpu_exhausted or report.evidence:
        return ""
    found = _FATAL.search(report.log_tail)
    return found.group(1).strip() if found else ""


def _stopped(report: TestReport) -> str:
    """Why a run that reported ended before its last test (pytest interrupted, or failing in its own machinery: tqdm's
    bug raised inside pytest's formatting of a failure), or "". Only canaries it never reached may be missing: any
    other evidence is the run's to answer for, never explained by the stop."""
    interrupted = report.reported and report.stopped and report.exit_code in (2, 3)
    if not interrupted or any(not e.startswith(_MISSING) for e in report.evidence):
        return ""
    found = _INTERNAL.findall(report.log_tail)
    return f"pytest stopped (exit {report.exit_code})" + (f": {found[-1].strip()[:REASON_LINE_CAP]}" if found else "")


def _isolated(
    sandbox: Sandbox, modules: list[str], limit: float, guard: Guard, env: EnvSpec, ended: str
) -> TestReport | None:
    """A run whose interpreter crashed or that stopped early, again one test module at a time: the modules' outcomes
    as each reports them. A module whose run crashes too failed as a whole (a collection error saying so), as a module
    that does not import does: before a fix, its tests fail and count as one unit. A module whose run stops too gives
    the outcomes it reported, the tests it never reached staying unknown (the result is a stopped run). None when
    another module's run has no report either (a timeout): the crash or stop stays unexplained. A crash or stop that
    no module repeats alone came of the modules together: each module's own run is still an honest outcome."""
    parts = {
        module: run_tests(sandbox, [module], timeout=limit, guard=guard, env=env, keep_selection=True)
        for module in modules
    }
    crashed = {module: f"the test process crashed: Fatal Python error: {why}" for module, part in parts.items()
               if (why := _crashed(part))}  # fmt: skip
    if any(not part.reported for module, part in parts.items() if module not in crashed):
        return None
    done = [part for module, part in parts.items() if module not in crashed]
    stopped = [part for part in done if _stopped(part)]  # their only evidence: the canaries they never reached
    outcomes = {t: o for part in done for t, o in part.outcomes.items()}
    outcomes |= {COLLECTION + module: "error" for module in crashed}
    return TestReport(
        exit_code=1,
        outcomes=outcomes,
        duration_s=round(sum(part.duration_s for part in parts.values()), 3),
        log_tail=ended,
        evidence=tuple(dict.fromkeys(e for part in done if part not in stopped for e in part.evidence)),
        canaries={c: o for part in done for c, o in part.canaries.items()},
        collection_errors=crashed | {m: e for part in done for m, e in part.collection_errors.items()},
        skipped_modules=tuple(m for part in done for m in part.skipped_modules),
        stopped=bool(stopped),
        failures={t: m for part in done for t, m in part.failures.items()},
        observations={t: v for part in done for t, v in part.observations.items()},
        expectations={t: v for part in done for t, v in part.expectations.items()},
        rows={f: r for part in done for f, r in part.rows.items()},
    )


def _known(reports: list[TestReport], test: str) -> set[str]:
    """What the runs that know ``test``'s outcome say of it: each run's report of it, else "error" where its module
    failed to collect (as a whole, one unit) or "skipped" where it was skipped at collection. A run that never
    reported it otherwise (it stopped early, or left it out) says nothing: absent is unknown, never failed."""
    module = _module(test)
    return {
        r.outcomes.get(test) or ("error" if module in r.collection_errors else "skipped")
        for r in reports
        if test in r.outcomes or module in r.collection_errors or module in r.skipped_modules
    }


def _module(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def _ids(report: TestReport) -> set[str]:
    return {t for t in report.outcomes if not t.startswith(COLLECTION)}


def _unstable(before: list[TestReport], after: list[TestReport]) -> set[str]:
    """Test ids that do not name the same test in every run: grading could not find them by name again.

    An id is unstable when a run of its tree does not report it although its module reported tests in that run
    (a module that failed to collect is the collection rules' business), or when only one of the two trees reports it
    although its module reported tests in the other: a fix does not rename tests, and which of a clock's value, a
    uuid or a directory's listing order changed an id cannot be told apart, so the test is dropped, never matched.
    """
    unstable: set[str] = set()
    for reports in (before, after):
        seen = set().union(*map(_ids, reports))
        for report in _whole(reports):
            ran = {_module(t) for t in _ids(report)}
            unstable |= {t for t in seen - report.outcomes.keys() if _module(t) in ran}
    was, now = set().union(*map(_ids, before)), set().union(*map(_ids, after))
    ran_before = {_module(t) for r in _whole(before) for t in _ids(r)}
    ran_after = {_module(t) for r in _whole(after) for t in _ids(r)}
    unstable |= {t for t in now - was if _module(t) in ran_before}
    return unstable | {t for t in was - now if _module(t) in ran_after}


def _whole(reports: list[TestReport]) -> list[TestReport]:
    """The runs that went to their last test."""
    return [r for r in reports if not r.stopped]


def _changed_unstable(before: list[TestReport], after: list[TestReport], unstable: set[str]) -> list[str]:
    """The unstable ids that pass with the fix while a test of the same function did not pass (or its module did not
    collect) before it: what would have been fail-to-pass, had the ids been stable."""
    failed_before = {_function(t) for r in before for t, o in r.outcomes.items() if o != "passed"}
    not_collected = _not_importing(before)
    changed = {
        t
        for r in after
        for t, o in r.outcomes.items()
        if t in unstable and o == "passed" and (_function(t) in failed_before or _module(t) in not_collected)
    }
    return sorted(changed)


def _function(test_id: str) -> str:
    return test_id.split("[", 1)[0]


def _judge(
    task: Task,
    before: list[TestReport],
    after: list[TestReport],
    start: float,
    touched: Sequence[str] = (),
) -> Task:
    """The verdict on the runs before and after the fix; ``touched``: the test patch's test modules."""
    runs = len(before) + len(after)
    # the repository's own: its baseline, if it can be; pytest stopped early never reached the later canaries
    evidence = [e for r in before + after for e in r.evidence if not (_stopped(r) and e.startswith(_MISSING))]
    if refused := rejection(evidence):
        return _verdict(task, False, refused, runs, start)
    if not all(r.reported for r in before + after):
        silent = [r for r in before + after if not r.reported]
        if any(r.log_tail.startswith(OVERFLOWED) for r in silent):  # a suite too large, not an error in it
            why = f"{OVERFLOWED} ({REPORT_CAP_BYTES >> 20} MiB)"
        else:
            why = ("timed out; " if any(r.timed_out for r in silent) else "") + _errors(silent)
        return _verdict(task, False, f"tests_did_not_run: {why}", runs, start)
    unstable = _unstable(before, after)
    tests = sorted(set().union(*map(_ids, before + after)) - unstable)
    was = {t: _known(before, t) for t in tests}
    now = {t: _known(after, t) for t in tests}
    # flaky: passed in some run of a tree and not in another (before the fix, failing one way or another is one thing:
    # tqdm's test that failed in one run errored in the next, as the bug's exception surfaced in its teardown)
    flaky = [t for t in tests if ("passed" in was[t] and len(was[t]) > 1) or len(now[t]) > 1]
    # passed in every run after the fix, each of which reported it: a run that never reached it leaves it unknown
    passing = [t for t in tests if now[t] == {"passed"} and all(t in r.outcomes for r in after)]
    f2p = [t for t in passing if was[t] and "passed" not in was[t] and t not in flaky]
    p2p = [t for t in passing if was[t] == {"passed"}]
    unknown = [t for t in tests if t not in f2p and t not in p2p and "passed" in now[t] and t not in flaky]
    broken = [t for t in tests if was[t] == {"passed"} and now[t] and "passed" not in now[t]]
    stopped = [r for r in before + after if r.stopped]
    validated = task.model_copy(update={"fail_to_pass": f2p, "pass_to_pass": p2p})
    modules, units = _units(f2p, before, after)
    validation = Validation(
        runs=runs,
        fail_to_pass_rates={t: _pass_rate(after, t) for t in f2p},
        pass_to_pass_rates={t: _pass_rate(after, t) for t in p2p},
        flaky_tests=flaky,
        duration_s=round(time.monotonic() - start, 3),
        slowest_run_s=round(max(r.duration_s for r in after), 3),
        not_importing=sorted(_not_importing(after)),
        unstable_ids=len(unstable),
        unstable_examples=sorted(unstable)[:UNSTABLE_EXAMPLES],
        stopped_runs=len(stopped),
        unknown_outcome=len(unknown),
        unknown_examples=unknown[:UNSTABLE_EXAMPLES],
        baseline_evidence=sorted(set(evidence)),
        fail_to_pass_modules_not_importing=modules,
        fail_to_pass_units=units,
    )
    reason = ""
    broken_by_fix = _not_importing(after) - (_not_importing(before) - set(touched))
    uncompilable = _uncompilable(before, after)
    if broken_by_fix and broken_by_fix <= uncompilable:
        reason = _incompatible_python(task, after, broken_by_fix)
    elif broken_by_fix:
        reason = f"collection_error_after_fix: {_errors(after, broken_by_fix)}"
    elif _cannot_start(before, touched) and _not_importing(before) and _not_importing(before) <= uncompilable:
        reason = _incompatible_python(task, before, _not_importing(before))
    elif _cannot_start(before, touched):
        reason = f"collection_error_before_fix: {_errors(before)}"
    elif not any(r.outcomes for r in after):
        command = " ".join((task.env or EnvSpec()).test_cmd)
        reason = f"no_tests_ran: `{command}` found no test in the tree (its discovery options, or the spec's test_cmd)"
    elif broken:
        reason = f"fix_breaks_tests: {broken[:3]}"
    elif not f2p and (changed := _changed_unstable(before, after, unstable)):
        reason = f"unstable_test_ids: the tests the fix changes have ids that differ between runs: {changed[:3]}"
    elif not f2p and stopped and unknown:
        reason = (
            f"tests_stopped: {len(stopped)} run(s) stopped early ({_stopped(stopped[0]) or stopped[0].log_tail}); "
            f"{len(unknown)} test(s) that pass after the fix have no outcome from every run: {unknown[:3]}"
        )
    elif not f2p:
        reason = "no_fail_to_pass: " + ("only flaky tests changed" if flaky else "no test fails before the fix")
        if _not_importing(after):  # the tests that would have failed may be in a module that never imports
            reason += f"; modules that import neither before nor after it: {_errors(after)}"
    validation.valid = not reason
    validation.reason = reason
    return validated.model_copy(update={"validation": validation})


def _units(f2p: list[str], before: list[TestReport], after: list[TestReport]) -> tuple[list[str], int]:
    """The fail-to-pass modules that did not import before the fix (each test of one is fail-to-pass, however many it
    holds), and the fail-to-pass units: those modules once each, and each other fail-to-pass test."""
    fixed = _not_importing(before) - _not_importing(after)
    modules = sorted({_module(t) for t in f2p} & fixed)
    alone = [t for t in f2p if _module(t) not in fixed]
    return modules, len(alone) + len(modules)


def _cannot_start(before: list[TestReport], touched: Sequence[str]) -> bool:
    """Before the fix no test ran, and not only because the test patch's modules need the fix to import.

    A test patch whose new tests import what the fix adds fails to collect before it: a good task. A suite
    whose other modules cannot import either (or that could not start at all) tests nothing before the fix.
    """
    if any(o in RAN for r in before for t, o in r.outcomes.items() if not t.startswith(COLLECTION)):
        return False
    errors = {module for r in before for module in r.collection_errors}
    if errors:
        return not touched or not errors <= set(touched)
    return any(r.exit_code not in (0, 1, 5) for r in before)  # the runner did not start (a conftest, a usage error)


def _uncompilable(before: list[TestReport], after: list[TestReport]) -> set[str]:
    """The test modules that fail to import with the same compile error before and after the fix: code the fix
    leaves as it was does not compile on the image's Python (a tree of another era), whatever the fix does."""
    was = {(m, e) for r in before for m, e in r.collection_errors.items() if _COMPILE_ERROR.match(e)}
    return {m for r in after for m, e in r.collection_errors.items() if (m, e) in was}


def _incompatible_python(task: Task, reports: list[TestReport], modules: set[str]) -> str:
    """An environment problem, not the fix's: the reason names the Python and how to choose another."""
    python = (task.env or EnvSpec()).python
    return (
        f"env_incompatible_python: the base tree does not compile on Python {python} (set `python:` in "
        f"{OVERRIDE_FILE} or params.yaml env.repos): {_errors(reports, modules)}"
    )


def _not_importing(reports: list[TestReport]) -> set[str]:
    """The test modules that failed to collect in any of ``reports``."""
    return {module for r in reports for module in r.collection_errors}


def _errors(reports: list[TestReport], modules: set[str] | None = None) -> str:
    """The first distinct error lines of ``reports``: their collection errors (of ``modules`` when given),
    else error lines of their logs."""
    lines = [
        f"{module}: {message}"
        for r in reports
        for module, message in r.collection_errors.items()
        if modules is None or module in modules
    ]
    if not lines:
        for report in reports:
            log = report.log_tail.splitlines()
            found = [m.group(1) for line in log if (m := _ERROR_LINE.match(line.strip()))]
            lines += found or [line.strip() for line in log[-1:]]
    distinct = [line[:REASON_LINE_CAP] for line in dict.fromkeys(lines) if line]
    return "; ".join(distinct[:REASON_LINES])[:REASON_CAP] or "no error output"


def _pass_rate(reports: list[TestReport], test: str) -> float:
    return sum(r.outcome(test) == "passed" for r in reports) / len(reports)


def _verdict(task: Task, valid: bool, reason: str, runs: int, start: float) -> Task:
    validation = Validation(runs=runs, valid=valid, reason=reason, duration_s=round(time.monotonic() - start, 3))
    return task.model_copy(update={"validation": validation})


def note_marks(task: Task, funnel: Funnel) -> None:
    """Count in ``funnel`` what validation left out of ``task`` (unstable test ids) and marked it with."""
    funnel.note("unstable_ids", task.validation.unstable_ids)
    funnel.note("underspecified", bool(task.statement and task.statement.underspecified))


def record_verdicts(tasks: list[Task], funnel: Funnel) -> list[Task]:
    """Count each verdict in ``funnel``, and what validation marked (``note_marks``); return the valid tasks."""
    valid = []
    for task in tasks:
        note_marks(task, funnel)
        if task.validation.valid:
            funnel.keep()
            valid.append(task)
        else:
            reason = task.validation.reason
            funnel.drop(task.task_id, reason.split(":", 1)[0], reason)
    return valid
