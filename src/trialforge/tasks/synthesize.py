"""Synthetic tasks: inject a bug into a working repository, keep it when a test notices, validate it.

    candidates -> compiled -> broke_test -> stated -> validated

Every candidate ends in exactly one place of that funnel (kept, or dropped with a reason), per family too; sandbox
lifecycle, test execution and host-side work are timed separately (``sandbox/timed.py``). What each step does:
docs/pipeline.md, "Synthetic tasks".
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trialforge.envspec import EnvSpec
from trialforge.errors import TaskError
from trialforge.funnel import Funnel
from trialforge.sandbox.base import Backend, Limits, SandboxSpec
from trialforge.sandbox.timed import TimedBackend, Timings
from trialforge.scratch import scratch_dir
from trialforge.tasks.envdetect.resolve import resolve_env
from trialforge.tasks.envimages import env_image
from trialforge.tasks.mutations import FAMILIES, Mutant, compile_error, library_files, mutants_of_source, sample_mutants
from trialforge.tasks.patches import IGNORED_DIRS, diff_trees, is_test_module, is_test_path, touched_paths
from trialforge.tasks.pytestconfig import python_files_of
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.statements import Screened, changed_lines, public_names, write_statement
from trialforge.tasks.validate import SuiteRuns, ValidateConfig, note_marks, validate_task
from trialforge.testrun.report import COLLECTION, TestReport
from trialforge.testrun.run import report_limits, run_tests

log = logging.getLogger(__name__)

STAGES = ("candidates", "compiled", "broke_test", "stated", "validated")

# A screening run's report and the tests (passing on the original) it broke.
Outcome = tuple[TestReport, tuple[str, ...]]
# Called as progress(phase, done, total) after each screened candidate and each validated task.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class SynthesisConfig:
    """The knobs of one synthesis run over one repository (all plain values, ready for params.yaml)."""

    max_per_file: int | None = 40
    max_total: int | None = 120  # candidates per repository
    max_tasks: int | None = None  # validated tasks per repository: validation stops once this many passed
    seed: int = 0
    families: tuple[str, ...] = tuple(FAMILIES)
    limits: Limits = field(default_factory=lambda: Limits(memory_mb=512, pids=128, disk_mb=128))
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    # A screening run is cut after max(this, 5 x the baseline run): mutants that loop forever must not
    # cost the full test timeout each.
    screen_timeout_s: float = 10.0
    concurrency: int = 1  # screening sandboxes and validations at once


# --- the funnel -------------------------------------------------------------------------------


@dataclass
class SynthesisFunnel(Funnel):
    """Every candidate is kept (validated) or dropped with a reason; stage counts per family too."""

    enumerated: Counter[str] = field(default_factory=Counter)  # mutants per family before sampling
    reached: dict[str, Counter[str]] = field(default_factory=dict)  # family -> stage -> count
    family_drops: dict[str, Counter[str]] = field(default_factory=dict)  # family -> reason -> count
    timings: Timings = field(default_factory=Timings)

    def reach(self, family: str, stage: str) -> None:
        self.reached.setdefault(family, Counter())[stage] += 1

    def reject(self, mutant: Mutant, reason: str, detail: str = "") -> None:
        self.drop(_ref(mutant), reason, detail)
        self.family_drops.setdefault(mutant.family, Counter())[reason] += 1

    def accept(self, mutant: Mutant) -> None:
        self.keep()
        self.reach(mutant.family, "validated")

    def stage_totals(self) -> dict[str, int]:
        return {stage: sum(c[stage] for c in self.reached.values()) for stage in STAGES}

    def by_family(self) -> dict[str, dict[str, Any]]:
        rows = {}
        for family in dict.fromkeys([*FAMILIES, *self.enumerated, *self.reached]):  # the PR mirror's too
            reached, drops = self.reached.get(family, Counter()), self.family_drops.get(family, Counter())
            if not reached and not self.enumerated[family]:
                continue
            rows[family] = {
                "enumerated": self.enumerated[family],
                **{stage: reached[stage] for stage in STAGES},
                "flaky_rejected": drops["flaky"],
                "dropped": dict(drops),
            }
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {
            **super().as_dict(),
            "enumerated": sum(self.enumerated.values()),
            "stages": self.stage_totals(),
            "flaky_rejected": self.dropped["flaky"],
            "by_family": self.by_family(),
            "timings": self.timings.as_dict(),
        }

    @classmethod
    def merged(cls, funnels: Iterable[SynthesisFunnel], stage: str = "synthesize") -> SynthesisFunnel:
        """One funnel summing several (one per repository)."""
        total = cls(stage)
        for f in funnels:
            total.seen += f.seen
            total.kept += f.kept
            total.dropped.update(f.dropped)
            total.details.extend(f.details)
            total.enumerated.update(f.enumerated)
            for family, counts in f.reached.items():
                total.reached.setdefault(family, Counter()).update(counts)
            for family, counts in f.family_drops.items():
                total.family_drops.setdefault(family, Counter()).update(counts)
            total.timings.merge(f.timings)
        return total


def _ref(mutant: Mutant) -> str:
    return f"{mutant.family}:{mutant.path}:{mutant.line}"


# --- the step ---------------------------------------------------------------------------------


def synthesize(
    repo_dir: Path,
    repo_name: str,
    backend: Backend,
    image: str,
    snapshots: SnapshotStore,
    cfg: SynthesisConfig | None = None,
    *,
    progress: Progress | None = None,
    env: EnvSpec | None = None,
    extra: Sequence[Mutant] = (),
) -> tuple[list[Task], SynthesisFunnel]:
    """Validated synthetic tasks from the working repository ``repo_dir``, and the funnel that made them.

    ``env``: the repository's environment spec (its test command and variables), given to every task it
    makes; None: plain pytest, and the tasks' ``env`` is left for the pipeline to resolve. ``extra``: candidates
    made elsewhere (the PR mirror's reverted hunks of real fixes), sampled and screened with the families'."""
    cfg = cfg or SynthesisConfig()
    tick = _Ticker(progress)
    funnel = SynthesisFunnel("synthesize")
    timings = funnel.timings
    timed = TimedBackend(backend, timings)
    start = time.perf_counter()
    with scratch_dir("synth") as tmp:
        original = _clean_copy(repo_dir, Path(tmp) / "original")
        with timings.measure("busy_s"):
            sources = {rel: (original / rel).read_text(encoding="utf-8") for rel in library_files(original)}
            candidates = _candidates(sources, cfg, funnel, extra)
            compiled = _compiled(candidates, sources, funnel)
        screened, digest = screen(compiled, original, sources, timed, image, cfg, funnel, tick, env)
        tasks = _tasks(screened, original, sources, repo_name, image, digest, snapshots, funnel)
        tasks = [(m, t.model_copy(update={"env": env})) for m, t in tasks] if env is not None else tasks
        validated = _validate(tasks, timed, image, snapshots, cfg, funnel, tick)
    timings.add("wall_s", time.perf_counter() - start)
    log.info("synthesize %s: %d validated of %d candidates", repo_name, funnel.kept, funnel.seen,
             extra={"funnel": funnel.as_dict()})  # fmt: skip
    return validated, funnel


@dataclass(frozen=True)
class Synthesizer:
    """What synthesis needs besides a repository: the sandboxes it screens and validates in, and the run's settings.
    ``Runtime.synthesizer`` builds it from params, so the pipeline, the CLI and the flows synthesize alike."""

    backend: Backend
    cfg: SynthesisConfig
    env_overrides: Mapping[str, Mapping[str, Any]] | None = None  # params.yaml ``env.repos``
    build_timeout_s: float = 1800.0

    def repository(
        self, repo_dir: Path, repo_name: str, snapshots: SnapshotStore, cfg: SynthesisConfig | None = None,
        *, extra: Sequence[Mutant] = (), progress: Progress | None = None,
    ) -> tuple[list[Task], SynthesisFunnel]:  # fmt: skip
        """:func:`synthesize` in the repository's own environment (detected, its image built once): mutants are
        screened and validated there, as its mined tasks will be."""
        env = resolve_env(repo_dir, repo_name, self.env_overrides)
        image = env_image(env, timeout_s=self.build_timeout_s).image.name
        return synthesize(repo_dir, repo_name, self.backend, image, snapshots, cfg or self.cfg, progress=progress,
                          env=env, extra=extra)  # fmt: skip


class _Ticker:
    """Thread-safe progress counts per phase, forwarded to the caller's callback (if any)."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.done: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, phase: str, total: int) -> None:
        if self.progress is None:
            return
        with self.lock:
            self.done[phase] += 1
            self.progress(phase, self.done[phase], total)


def _clean_copy(repo_dir: Path, dest: Path) -> Path:
    """The repository without history, caches or bytecode: what every sandbox and snapshot starts from."""
    if not repo_dir.is_dir():
        raise TaskError(f"repository {repo_dir} does not exist or is not a directory")
    shutil.copytree(repo_dir, dest, symlinks=True, ignore=shutil.ignore_patterns(*IGNORED_DIRS, "*.pyc"))
    return dest


def _candidates(
    sources: dict[str, str], cfg: SynthesisConfig, funnel: SynthesisFunnel, extra: Sequence[Mutant]
) -> list[Mutant]:
    files = sorted(sources) if cfg.families else []  # no family: the ``extra`` candidates alone
    everything = [m for rel in files for m in mutants_of_source(rel, sources[rel], cfg.families)]
    everything += [m for m in extra if m.path in sources]
    funnel.enumerated.update(m.family for m in everything)
    picked = sample_mutants(everything, max_per_file=cfg.max_per_file, max_total=cfg.max_total, seed=cfg.seed)
    for mutant in picked:
        funnel.reach(mutant.family, "candidates")
    return picked


def _compiled(candidates: list[Mutant], sources: dict[str, str], funnel: SynthesisFunnel) -> list[Mutant]:
    kept = []
    for mutant in candidates:
        error = compile_error(mutant, sources[mutant.path])
        if error is None:
            funnel.reach(mutant.family, "compiled")
            kept.append(mutant)
        else:
            funnel.reject(mutant, "equivalent" if error.startswith("equivalent") else "does_not_compile", error)
    return kept


# --- screening --------------------------------------------------------------------------------


class Screener:
    """One sandbox seeded from the original tree, reused for many mutants: write, run, restore."""

    def __init__(
        self, backend: Backend, image: str, original: Path, limits: Limits, env: EnvSpec | None = None
    ) -> None:
        self.env = env
        spec = SandboxSpec(image=image, workspace=original, limits=report_limits(limits),  # a real suite's report
                           labels={"purpose": "synthesize-screen"})  # fmt: skip
        self.sandbox = backend.create(spec)
        try:
            self.clean = self.sandbox.snapshot()
        except Exception:
            self.sandbox.close()
            raise
        self.backend = backend

    def run(self, files: dict[str, str], timeout: float) -> TestReport:
        """The whole suite with ``files`` written over the original tree; the tree is clean again afterwards."""
        try:
            for rel, text in files.items():
                self.sandbox.write_file(rel, text.encode("utf-8"))
            return run_tests(self.sandbox, None, timeout=timeout, env=self.env)
        finally:
            self.sandbox.restore(self.clean)

    def close(self) -> None:
        try:
            self.sandbox.close()
        finally:
            self.backend.release(self.clean)


def screen(
    mutants: list[Mutant],
    original: Path,
    sources: dict[str, str],
    backend: Backend,
    image: str,
    cfg: SynthesisConfig,
    funnel: SynthesisFunnel,
    tick: Callable[[str, int], None] | None = None,
    env: EnvSpec | None = None,
) -> tuple[list[Screened], str]:
    """The mutants that break a test that passes on the original, and the image digest they ran on."""
    workers = max(1, min(cfg.concurrency, len(mutants)))
    # The reaper removes sandboxes past their deadline: give screening sandboxes time for their whole share, and the
    # first one for the baseline run too, which measures the suite as validation's first run does (max_duration_s).
    deadline = cfg.limits.episode_timeout_s + (len(mutants) // workers + 2) * cfg.screen_timeout_s * 5
    deadline += cfg.validate.max_duration_s
    limits = cfg.limits.model_copy(update={"episode_timeout_s": deadline})
    screeners: list[Screener] = []
    try:
        with funnel.timings.measure("busy_s"):
            screeners.append(Screener(backend, image, original, limits, env))
            baseline = screeners[0].run({}, timeout=cfg.validate.max_duration_s)
        passing = _baseline_passing(baseline, original)
        timeout = max(cfg.screen_timeout_s, 5 * baseline.duration_s)
        with funnel.timings.measure("busy_s"):
            screeners += [Screener(backend, image, original, limits, env) for _ in range(workers - 1)]

        def share(worker: int) -> list[tuple[str, Outcome]]:
            done = (lambda: tick("screen", len(mutants))) if tick else (lambda: None)
            todo = mutants[worker::workers]
            return _screen_share(screeners[worker], todo, sources, passing, timeout, funnel.timings, done)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            outcomes = dict(item for part in pool.map(share, range(workers)) for item in part)
        digest = backend.image_for(image).digest  # the content digest, the same on every backend
    finally:
        for screener in screeners:
            screener.close()
    return _sort_screened(mutants, outcomes, funnel), digest


def _sort_screened(mutants: list[Mutant], outcomes: dict[str, Outcome], funnel: SynthesisFunnel) -> list[Screened]:
    """Keep the mutants some test noticed, in candidate order (whatever order the workers finished in)."""
    kept = []
    for mutant in mutants:
        report, broke = outcomes[mutant.digest]
        if not report.reported:  # a mutant that loops forever or kills the interpreter: not a usable task
            reason = "screen_timeout" if report.timed_out else "tests_did_not_run"
            funnel.reject(mutant, reason, f"no test report: {report.log_tail[-300:]}")
        elif not broke:
            funnel.reject(mutant, "no_test_broke", "every test that passes on the original still passes")
        else:
            funnel.reach(mutant.family, "broke_test")
            kept.append(Screened(mutant, broke, report.log_tail, report.failures))
    return kept


def _baseline_passing(baseline: TestReport, original: Path) -> frozenset[str]:
    passing = frozenset(t for t, o in baseline.outcomes.items() if o == "passed")
    if not baseline.reported or not passing:
        raise TaskError(
            f"the test suite of {original.name} does not pass on the unmodified repository "
            f"(exit {baseline.exit_code}): fix the repository or its image first. Log: {baseline.log_tail[-500:]}"
        )
    return passing


def _screen_share(
    screener: Screener, mutants: list[Mutant], sources: dict[str, str], passing: frozenset[str],
    timeout: float, timings: Timings, on_done: Callable[[], None],
) -> list[tuple[str, Outcome]]:  # fmt: skip
    out = []
    for mutant in mutants:
        with timings.measure("busy_s"):
            report = screener.run({mutant.path: mutant.apply(sources[mutant.path])}, timeout)
        broke = tuple(sorted(t for t in report.outcomes if t not in passing and t.startswith("<collection>")))
        broke += tuple(sorted(t for t in passing if report.outcome(t) != "passed"))
        out.append((mutant.digest, (report, broke)))
        on_done()
    return out


# --- tasks ------------------------------------------------------------------------------------


def _tasks(
    screened: list[Screened], original: Path, sources: dict[str, str], repo_name: str, image: str,
    image_digest: str, snapshots: SnapshotStore, funnel: SynthesisFunnel,
) -> list[tuple[Mutant, Task]]:  # fmt: skip
    public = public_names(sources)
    out = []
    with scratch_dir("mutant") as tmp:
        for item in screened:
            with funnel.timings.measure("busy_s"):
                task = _task(item, original, Path(tmp), sources, repo_name, public, snapshots)
            if task is None:
                funnel.reject(item.mutant, "statement_leaks", "the statement would show the changed code")
                continue
            funnel.reach(item.mutant.family, "stated")
            out.append((item.mutant, task.model_copy(update={"image": image, "image_digest": image_digest})))
    return out


def _task(item: Screened, original: Path, tmp: Path, sources: dict[str, str], repo_name: str,
          public: dict[str, str], snapshots: SnapshotStore) -> Task | None:  # fmt: skip
    """The task for one screened mutant: the mutated tree without the test modules it broke stored as the snapshot,
    those modules as the test patch, the revert as the gold patch.

    The broken tests are the task's fail-to-pass tests: left in the workspace, the policy could read each input and
    expected value and answer them one by one (no forged report needed, so nothing the host judges could tell), so
    they are hidden as a mined task's new tests are; the statement says what they showed failing, never what they
    expect."""
    mutant = item.mutant
    tree, hidden = tmp / mutant.digest, tmp / f"{mutant.digest}-hidden"
    shutil.copytree(original, tree, symlinks=True)
    try:
        (tree / mutant.path).write_text(mutant.apply(sources[mutant.path]), encoding="utf-8")
        gold = diff_trees(tree, original)
        statement = write_statement(repo_name, item, public, changed_lines(gold))
        if statement is None:
            return None
        # the test patch adds the broken modules back: a diff from no file to them, not from tree to tree (a diff of
        # whole trees copies both)
        (hidden / "modules").mkdir(parents=True)
        (hidden / "none").mkdir()
        for rel in broken_modules(item.broke, tree):
            (hidden / "modules" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(tree / rel, hidden / "modules" / rel)
        test_patch = diff_trees(hidden / "none", hidden / "modules")
        digest = snapshots.put(tree)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(hidden, ignore_errors=True)
    return Task(
        task_id=f"{repo_name}-syn-{mutant.digest[:10]}",
        source=Source(kind="synthetic", ref=_ref(mutant)),
        repo=repo_name,
        snapshot=digest,
        problem_statement=statement,
        gold_patch=gold,
        test_patch=test_patch,
    )


def visible_fail_to_pass(task: Task) -> list[str]:
    """The fail-to-pass tests of ``task`` whose module its snapshot keeps (validation saw a test fail that screening
    did not): their expected values would be in the policy's workspace, so the task is not made."""
    hidden = set(touched_paths(task.test_patch))
    return [t for t in task.fail_to_pass if is_test_path(module := t.split("::", 1)[0]) and module not in hidden]


def broken_modules(broke: Iterable[str], tree: Path) -> list[str]:
    """The test modules of the ``broke`` ids (tests, or modules that failed to collect). A doctest of a library module
    is not one: its module is the code (such a test has no assertion the host judges, so the quality gate drops the
    task: ``quality.require_host_judged``)."""
    collected = python_files_of(tree)
    paths = dict.fromkeys(t.removeprefix(COLLECTION).split("::", 1)[0] for t in broke)
    return [p for p in paths if is_test_module(p, collected) and (tree / p).is_file()]


def _validate(tasks: list[tuple[Mutant, Task]], backend: Backend, image: str, snapshots: SnapshotStore,
              cfg: SynthesisConfig, funnel: SynthesisFunnel, tick: _Ticker) -> list[Task]:  # fmt: skip
    shared = SuiteRuns()  # every task's fixed tree is the original repository: its suite runs once

    def one(task: Task) -> Task:
        with funnel.timings.measure("busy_s"):
            checked = validate_task(task, backend, image, snapshots, cfg.limits, cfg.validate, shared)
        tick("validate", len(tasks))
        return checked

    workers = max(1, cfg.concurrency)
    wanted = len(tasks) if cfg.max_tasks is None else cfg.max_tasks
    valid: list[Task] = []
    pending = list(tasks)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while pending and len(valid) < wanted:  # in batches: no validation runs once ``max_tasks`` passed
            size = max(workers, wanted - len(valid))
            batch, pending = pending[:size], pending[size:]
            checked = list(pool.map(one, [task for _, task in batch]))
            for (mutant, _), task in zip(batch, checked, strict=True):
                _verdict(mutant, task, funnel, valid, wanted)
    for mutant, _ in pending:
        funnel.reject(mutant, "count_reached", f"{wanted} tasks were validated before this one's turn")
    return valid


def _verdict(mutant: Mutant, task: Task, funnel: SynthesisFunnel, valid: list[Task], wanted: int) -> None:
    """Count one validated candidate in the funnel, appending its task to ``valid`` while fewer than ``wanted``."""
    note_marks(task, funnel)  # as record_verdicts counts a mined task's
    if visible := visible_fail_to_pass(task):
        funnel.reject(mutant, "fail_to_pass_visible", f"validation found failing tests screening did not, in modules "
                      f"left in the workspace: {', '.join(visible[:3])}")  # fmt: skip
    elif task.validation.valid and len(valid) < wanted:
        funnel.accept(mutant)
        valid.append(task)
    elif task.validation.valid:
        funnel.reject(mutant, "count_reached", f"{wanted} tasks were validated in the same batch")
    else:
        reason = task.validation.reason
        flaky = "flaky" in reason or bool(task.validation.flaky_tests)
        funnel.reject(mutant, "flaky" if flaky else reason.split(":", 1)[0], reason)
