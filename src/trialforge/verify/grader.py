"""Grade an agent's diff without trusting anything from the rollout sandbox.

The diff goes on a copy of the pristine base snapshot; every path it changed, as the two trees show (never as its
text names them), that is a test file or runner setting is put back as pristine has it; the task's test patch goes on
top and canaries are planted (``trialforge.testrun``); the named tests run in a fresh sandbox. Reward is 1 only when the
run shows no tampering and every fail-to-pass and pass-to-pass test passed; a tampered run scores 0 with
``tampered:<evidence>`` flags. Evidence the task's own trees gave at validation (its baseline) is a ``baseline:``
flag, not a zero. The same diff always gets the same score, so episodes that end in the same diff are
graded once. docs/verification.md.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath

from trialforge.envspec import EnvSpec
from trialforge.errors import PatchError, SandboxError
from trialforge.memo import OncePerKey
from trialforge.sandbox.base import Backend, Limits, SandboxSpec
from trialforge.sandbox.images import ENV_REPO
from trialforge.scratch import scratch_dir
from trialforge.tasks.envimages import task_image
from trialforge.tasks.extbuild import BuildFailed, build_tree, is_build_input, place
from trialforge.tasks.patches import (
    IGNORED_DIRS,
    apply_patch,
    changed_paths,
    is_test_path,
    link_escapes,
    test_files,
    touched_paths,
)
from trialforge.tasks.pytestconfig import python_files_of
from trialforge.tasks.schema import HostJudged, Task
from trialforge.tasks.settings import ValidateConfig
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.testrun.baseline import FLAG as BASELINE_FLAG
from trialforge.testrun.baseline import beyond
from trialforge.testrun.prepare import prepare
from trialforge.testrun.report import TestReport
from trialforge.testrun.run import report_limits, run_tests
from trialforge.verify.integrity import integrity_flags
from trialforge.verify.settings import VerifyConfig

VERIFIER_VERSION = "3"  # 3: blinded expectations judged on the host; 2: runtime tamper evidence and canaries


@dataclass
class Verdict:
    reward: float | None  # None: the verifier could not decide (verifier_error)
    status: str  # ok | verifier_error | env_error
    reason: str
    outcomes: dict[str, str] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    provenance: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    cpu_s: float | None = 0.0  # what its sandbox's counter says it used; 0 for a verdict this caller did not compute

    def report(self) -> dict:
        return asdict(self)


def restore_tests(pristine: Path, tree: Path, collected: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """Put back in ``tree`` (``pristine`` copied, then patched) every changed path that is a test file, runner
    setting or import-time file (``is_test_path``), as ``pristine`` has it. Returns (the changed paths kept, those put
    back). ``collected``: the pristine tree's ``python_files`` globs, so a repository whose tests are ``check_*.py``
    keeps its tests out of the policy's hands too."""
    kept, dropped = [], []
    for rel in changed_paths(pristine, tree):
        # bytecode and tool caches (IGNORED_DIRS) are never the policy's either
        if is_test_path(rel, collected) or any(part in IGNORED_DIRS for part in PurePosixPath(rel).parts):
            _restore(pristine, tree, rel)
            dropped.append(rel)
        else:
            kept.append(rel)
    return kept, dropped


def _restore(pristine: Path, tree: Path, rel: str) -> None:
    target = tree / rel
    for parent in reversed(target.relative_to(tree).parents[:-1]):  # a file or link where pristine has a directory
        if (tree / parent).is_symlink() or (tree / parent).is_file():
            (tree / parent).unlink()
    if target.is_symlink() or target.is_file():
        target.unlink()
    source = pristine / rel
    if source.is_symlink() or source.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


@dataclass(frozen=True)
class Grader:
    backend: Backend
    image: str  # for tasks that name none (the base image); a task's own image otherwise
    image_digest: str
    snapshots: SnapshotStore
    limits: Limits
    suite: ValidateConfig = field(default_factory=ValidateConfig)  # a task's own time limit (``limit_for``)
    timing: VerifyConfig = field(default_factory=VerifyConfig)  # how much of that a task's graded run gets
    test_timeout_s: float | None = None  # a lower cap on every graded run (the quality gate's candidates); None: none
    # The modules each task's pristine sources compile to, for diffs that change none of its build inputs.
    _pristine_builds: OncePerKey[dict[str, bytes]] = field(
        default_factory=OncePerKey, init=False, repr=False, compare=False
    )
    # One grading per (task, code diff); infrastructure faults are not kept.
    _verdicts: OncePerKey[Verdict] = field(
        default_factory=lambda: OncePerKey(keep=lambda v: v.status != "env_error"),
        init=False,
        repr=False,
        compare=False,
    )

    def grade(self, task: Task, diff: str) -> Verdict:
        start = time.monotonic()
        collected = python_files_of(self.snapshots.materialize(task.snapshot))  # the pristine tree's own globs
        flags = integrity_flags(diff, collected)
        diff_sha = hashlib.sha256(diff.encode("utf-8", "surrogateescape")).hexdigest()
        verdict = self._cached(task, diff, diff_sha)
        verdict.flags = sorted(set(verdict.flags) | set(flags))  # runtime evidence, then the audit patterns
        verdict.provenance = {
            "verifier_version": VERIFIER_VERSION,
            "image_digest": task.image_digest if task.image.startswith(ENV_REPO + ":") else self.image_digest,
            "base_snapshot": task.snapshot,
            "diff_sha256": diff_sha,
            **verdict.provenance,  # what grading put back: dropped_paths
        }
        verdict.duration_s = round(time.monotonic() - start, 3)
        return verdict

    def timeout_for(self, task: Task) -> float:
        """The limit on ``task``'s graded test run: ``timing.timeout_factor`` x its slowest validated suite run (at
        least ``timing.min_timeout_s``) within the task's own limit, and ``test_timeout_s`` if set. Both come from
        the runs validation timed on the task's own trees, never from anything a diff holds: an edit cannot buy
        itself more time. A task never timed gets ``suite.test_timeout_s``."""
        slowest = task.validation.slowest_run_s
        sized = self.suite.test_timeout_s
        if slowest > 0:
            sized = min(
                self.suite.limit_for(slowest), max(self.timing.min_timeout_s, self.timing.timeout_factor * slowest)
            )
        return sized if self.test_timeout_s is None else min(self.test_timeout_s, sized)

    def cpu_budget_for(self, task: Task) -> float | None:
        """The CPU-seconds ``task``'s graded test process may use (None: a task never timed has no budget).

        Derived from the slowest validated run's wall time: a sandbox of ``limits.cpus`` CPUs cannot have
        given that run more CPU time than wall time x cpus, so the budget is at least ``timeout_factor`` x
        what it used, however loaded the machine was then or is now.
        """
        slowest = task.validation.slowest_run_s
        if slowest <= 0:
            return None
        return max(self.timing.min_cpu_s, self.timing.timeout_factor * slowest * max(1.0, self.limits.cpus))

    def _cached(self, task: Task, diff: str, diff_sha: str) -> Verdict:
        """One grading per (task, code diff); concurrent askers wait for the first. Infra faults are not kept."""
        graded_here: list[bool] = []

        def grade() -> Verdict:
            graded_here.append(True)
            return self._grade(task, diff)

        verdict = self._verdicts.get(f"{task.content_hash()}:{diff_sha}", grade)
        # each caller fills in its own flags and provenance, and pays only for a grading it ran
        return replace(verdict) if graded_here else replace(verdict, cpu_s=0.0)

    def _grade(self, task: Task, diff: str) -> Verdict:
        with scratch_dir("grade") as tmp:
            pristine = self.snapshots.materialize(task.snapshot)
            tree = Path(tmp) / "repo"
            shutil.copytree(pristine, tree, symlinks=True)
            if diff.strip():
                try:
                    apply_patch(tree, diff)
                except PatchError as exc:
                    return Verdict(0.0, "ok", f"diff_does_not_apply: {exc}")
            changed, dropped = restore_tests(pristine, tree, python_files_of(pristine))
            put_back = {"dropped_paths": ",".join(dropped)}
            escaping = [p for p in changed if (tree / p).is_symlink() and link_escapes(p, os.readlink(tree / p))]
            if escaping:
                return Verdict(0.0, "ok", f"unsafe_patch: symlink {escaping[0]} points outside", provenance=put_back)
            try:
                if task.test_patch:
                    apply_patch(tree, task.test_patch)
            except PatchError as exc:
                return Verdict(None, "verifier_error", f"test_patch_does_not_apply: {exc}")
            broken = _syntax_errors(tree, changed)
            if broken:  # the cheap layer: no sandbox for code that cannot even compile
                return Verdict(0.0, "ok", f"syntax_error: {broken[0]}", provenance=put_back)
            verdict = self._run(task, tree, changed)
            verdict.provenance = put_back
            return verdict

    def _run(self, task: Task, tree: Path, changed: list[str]) -> Verdict:
        # in the suite's order, as validation ran them: a fail-to-pass module run first can break a pass-to-pass one
        # whose module pytest runs before it (tqdm's tests_synchronisation hangs once tests_tqdm has run)
        tests = sorted(task.fail_to_pass + task.pass_to_pass)
        if not task.fail_to_pass:
            return Verdict(None, "verifier_error", "task has no fail-to-pass tests (not validated?)")
        env = task.env or EnvSpec()
        if env.build is not None and (failed := self._build(task, tree, env, changed)) is not None:
            return failed
        known = task.validation.host_judged or HostJudged()
        guard = prepare(tree, tests, test_files(tree), changed=changed, copy_from=task.fail_to_pass, runner=env.runner,
                        observe="blind", in_process=known.in_process, param_rows=known.param_rows,
                        recorded=known.recorded)  # fmt: skip
        limits = report_limits(self.limits)
        try:
            image = task_image(task, self.backend, self.image)
            # the reaper removes a sandbox past its deadline, its owner alive or not: room for a whole graded run
            room = limits.episode_timeout_s + self.timeout_for(task)
            spec = SandboxSpec(image.name, tree, limits, labels={"purpose": "verify"}, lifetime_s=room)
            sandbox = self.backend.create(spec)
        except SandboxError as exc:
            return Verdict(None, "env_error", f"verifier sandbox failed: {exc}")
        cpu_start = sandbox.cpu_s()
        try:
            report = run_tests(sandbox, tests, timeout=self.timeout_for(task), guard=guard, stop_early=True, env=env,
                               cpu_s=self.cpu_budget_for(task))  # fmt: skip
        except SandboxError as exc:  # what the run used before it failed is not counted: unknown, not 0
            return Verdict(None, "env_error", f"verifier sandbox failed: {exc}", cpu_s=None)
        finally:
            cpu_end = sandbox.cpu_s()
            sandbox.close()
        verdict = _judge(report, tests, task.validation.baseline_evidence)
        verdict.cpu_s = None if cpu_start is None or cpu_end is None else round(cpu_end - cpu_start, 4)
        return verdict

    def _build(self, task: Task, tree: Path, env: EnvSpec, changed: list[str]) -> Verdict | None:
        """Compile the extensions of the graded tree (the diff applied, every compiled object it carried put back as
        pristine has it) in a sandbox of their own: a diff that breaks the build scores 0, since its tests cannot
        run; None when it built. A tree whose build inputs the diff left alone gets the modules its pristine
        sources (and test patch) compile to, built once per task by this grader: never an object of the policy's."""
        build = env.build
        assert build is not None
        limits = report_limits(self.limits)
        try:
            image = task_image(task, self.backend, self.image)
            if any(is_build_input(p, build) for p in [*changed, *touched_paths(task.test_patch)]):
                build_tree(self.backend, image.name, tree, build, limits, "verify-build", _tests_of(tree, task))
            else:
                key = f"{task.snapshot}|{image.digest}|{build.model_dump_json()}|{task.test_patch}"
                place(tree, self._pristine_builds.get(key, lambda: self._pristine_build(task, image.name, limits)))
        except BuildFailed as exc:
            return Verdict(0.0, "ok", f"build_failed: {exc}", flags=["build_failed"])
        except SandboxError as exc:
            return Verdict(None, "env_error", f"verifier build sandbox failed: {exc}")
        return None

    def _pristine_build(self, task: Task, image: str, limits: Limits) -> dict[str, bytes]:
        assert task.env is not None and task.env.build is not None
        with scratch_dir("grade-build") as tmp:
            tree = Path(tmp) / "repo"
            shutil.copytree(self.snapshots.materialize(task.snapshot), tree, symlinks=True)
            if task.test_patch:
                apply_patch(tree, task.test_patch)
            return build_tree(self.backend, image, tree, task.env.build, limits, "verify-build", _tests_of(tree, task))


def _tests_of(tree: Path, task: Task) -> list[str]:
    """What a graded build never sees: the tree's test files and what the test patch adds (data with expected values
    too), less build inputs (a C helper a test patch adds must still compile). The diff's setup.py runs in the build,
    and what it reads there it can compile into the module the tests import."""
    assert task.env is not None and task.env.build is not None
    hidden = {*test_files(tree), *touched_paths(task.test_patch)}
    return sorted(p for p in hidden if not is_build_input(p, task.env.build))


def _judge(report: TestReport, tests: list[str], known: Sequence[str] = ()) -> Verdict:
    """The verdict on a graded run; ``known``: the task's baseline evidence, an audit flag here, never a zero."""
    outcomes = {t: report.outcome(t) for t in tests}
    unexplained, explained = beyond(report.evidence, known)
    flags = [f"tampered:{e}" for e in unexplained] + [f"{BASELINE_FLAG}{e}" for e in explained]
    if unexplained:
        return Verdict(0.0, "ok", f"tampered: {', '.join(unexplained[:5])}", outcomes, flags)
    if not report.reported:
        reason = (
            "timed_out" if report.timed_out
            else "cpu_budget_spent: the test process used up its CPU-seconds" if report.cpu_exhausted
            else "no_report: the test process died before reporting"
        )  # fmt: skip
        return Verdict(0.0, "ok", reason, outcomes, flags)
    if all(o == "passed" for o in outcomes.values()):  # pytest exits 1 (the must-fail canaries): report.py agrees
        return Verdict(1.0, "ok", "all_tests_passed", outcomes, flags)
    failing = sorted(t for t, o in outcomes.items() if o != "passed")
    judged = [f"{t}: {why}" for t, why in sorted(report.host_failures.items())[:3]]
    host = f"; host checks: {judged}" if judged else ""
    return Verdict(0.0, "ok", f"pytest_exit={report.exit_code}; not passed: {failing[:5]}{host}", outcomes, flags)


def _syntax_errors(tree: Path, paths: list[str]) -> list[str]:
    """Compile (never run) each changed Python file on the host."""
    errors = []
    for rel in paths:
        path = tree / rel
        if rel.endswith(".py") and path.is_file() and not path.is_symlink():
            try:
                compile(path.read_bytes(), rel, "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                errors.append(f"{rel}: {exc}")
    return errors
