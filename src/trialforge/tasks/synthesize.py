"""Synthetic tasks: inject a bug into a working repository, keep it when a test notices, validate it.

    candidates -> compiled -> broke_test -> stated -> validated

1. *Candidates*: every single-site mutant of the library code (``tasks/mutations.py``), sampled
   with a seed, family-balanced, at most ``max_per_file`` / ``max_total``.
2. *Compiled*: the mutated file compiles and differs in code from the original.
3. *Broke a test*: screening runs the suite in ONE sandbox seeded from the original tree per worker,
   writing each mutant's file and restoring a snapshot between candidates (a sandbox start per
   candidate would cost more than the write-run-restore cycle). A candidate is kept when a test
   that passes on the original no longer passes; which tests broke is recorded. Mutants that hang
   are cut off early (``screen_timeout``) instead of costing a full test timeout later.
4. *Stated*: a problem statement written from what the failing tests show (their names, the
   public function they call, the observed error or values), phrased as a user's bug report.
   It never shows the mutated or original line, the mutation's file line, or the family name;
   a candidate whose statement would leak is dropped rather than shipped.
5. *Validated*: ``validate_task`` runs the suite before/after the gold patch ``runs`` times in
   fresh sandboxes and fills fail_to_pass / pass_to_pass; flaky candidates are rejected there.
   Every task's fixed tree is the original repository, so its runs are shared by the batch.

Every candidate ends in exactly one place of the funnel (kept, or dropped with a reason), per
family too. Sandbox lifecycle, test execution and our own host-side work are timed separately.
"""

from __future__ import annotations

import ast
import logging
import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trialforge import pyast
from trialforge.envspec import EnvSpec
from trialforge.errors import TaskError
from trialforge.funnel import Funnel
from trialforge.sandbox.base import WORKDIR, Backend, ExecResult, Limits, Sandbox, SandboxSpec, Snapshot
from trialforge.scratch import scratch_dir
from trialforge.tasks.mutations import FAMILIES, Mutant, compile_error, library_files, mutants_of_source, sample_mutants
from trialforge.tasks.patches import IGNORED_DIRS, diff_trees, is_test_path
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import SuiteRuns, ValidateConfig, validate_task
from trialforge.testrun import TestReport, run_tests

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
    max_total: int | None = 120  # per repository
    seed: int = 0
    families: tuple[str, ...] = tuple(FAMILIES)
    limits: Limits = field(default_factory=lambda: Limits(memory_mb=512, pids=128, disk_mb=128))
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    # A screening run is cut after max(this, 5 x the baseline run): mutants that loop forever must not
    # cost the full test timeout each.
    screen_timeout_s: float = 10.0
    concurrency: int = 1  # screening sandboxes and validations at once


# --- timing -----------------------------------------------------------------------------------


@dataclass
class Timings:
    """Seconds spent, summed over workers: sandbox lifecycle, test execution, and the rest (ours)."""

    wall_s: float = 0.0
    busy_s: float = 0.0  # time inside units of work (screen one candidate, build or validate one task)
    sandbox_s: float = 0.0  # create / snapshot / restore / write / close
    tests_s: float = 0.0  # commands run in sandboxes (the test suite)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + seconds)

    @contextmanager
    def measure(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    @property
    def ours_s(self) -> float:
        """Host-side work of ours and of the steps we call: enumeration, diffs, packing, statements."""
        return max(self.busy_s - self.sandbox_s - self.tests_s, 0.0)

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in {
            "wall_s": self.wall_s, "busy_s": self.busy_s, "sandbox_s": self.sandbox_s,
            "tests_s": self.tests_s, "ours_s": self.ours_s,
        }.items()}  # fmt: skip

    def merge(self, other: Timings) -> None:
        for name in ("wall_s", "busy_s", "sandbox_s", "tests_s"):
            self.add(name, getattr(other, name))


class TimedSandbox:
    """A sandbox that books its calls: ``exec`` as test time, everything else as sandbox lifecycle."""

    def __init__(self, inner: Sandbox, timings: Timings) -> None:
        self.inner = inner
        self.timings = timings
        self.image_digest = inner.image_digest
        self.backend = inner.backend
        self.deadline = inner.deadline

    def exec(self, argv: Sequence[str], *, timeout: float | None = None, cwd: str = WORKDIR,
             env: dict[str, str] | None = None) -> ExecResult:  # fmt: skip
        with self.timings.measure("tests_s"):
            return self.inner.exec(argv, timeout=timeout, cwd=cwd, env=env)

    def read_file(self, path: str) -> bytes:
        with self.timings.measure("sandbox_s"):
            return self.inner.read_file(path)

    def write_file(self, path: str, data: bytes) -> None:
        with self.timings.measure("sandbox_s"):
            self.inner.write_file(path, data)

    def snapshot(self) -> Snapshot:
        with self.timings.measure("sandbox_s"):
            return self.inner.snapshot()

    def restore(self, snap: Snapshot) -> None:
        with self.timings.measure("sandbox_s"):
            self.inner.restore(snap)

    def reset(self, workspace: Path | None) -> None:
        with self.timings.measure("sandbox_s"):
            self.inner.reset(workspace)

    def alive(self) -> bool:
        return self.inner.alive()

    def cpu_s(self) -> float | None:
        return self.inner.cpu_s()

    def export_workspace(self, dest: Path) -> None:
        with self.timings.measure("sandbox_s"):
            self.inner.export_workspace(dest)

    def close(self) -> None:
        with self.timings.measure("sandbox_s"):
            self.inner.close()


class TimedBackend:
    """Wraps a backend so every sandbox it makes (ours or ``validate_task``'s) is timed the same way."""

    def __init__(self, inner: Backend, timings: Timings) -> None:
        self.inner = inner
        self.timings = timings
        self.name = inner.name
        self.image_for = inner.image_for

    def create(self, spec: SandboxSpec) -> TimedSandbox:
        with self.timings.measure("sandbox_s"):
            return TimedSandbox(self.inner.create(spec), self.timings)

    def from_snapshot(self, snap: Snapshot, spec: SandboxSpec) -> TimedSandbox:
        with self.timings.measure("sandbox_s"):
            return TimedSandbox(self.inner.from_snapshot(snap, spec), self.timings)

    def release(self, snap: Snapshot) -> None:
        with self.timings.measure("sandbox_s"):
            self.inner.release(snap)


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
        for family in FAMILIES:
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


@dataclass(frozen=True)
class Screened:
    """A candidate that broke at least one test, with the evidence the statement is written from."""

    mutant: Mutant
    broke: tuple[str, ...]
    log: str


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
) -> tuple[list[Task], SynthesisFunnel]:
    """Validated synthetic tasks from the working repository ``repo_dir``, and the funnel that made them.

    ``env``: the repository's environment spec (its test command and variables), given to every task it
    makes; None: plain pytest, and the tasks' ``env`` is left for the pipeline to resolve."""
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
            candidates = _candidates(sources, cfg, funnel)
            compiled = _compiled(candidates, sources, funnel)
        screened, digest = screen(compiled, original, sources, timed, image, cfg, funnel, tick, env)
        tasks = _tasks(screened, original, sources, repo_name, image, digest, snapshots, funnel)
        tasks = [(m, t.model_copy(update={"env": env})) for m, t in tasks] if env is not None else tasks
        validated = _validate(tasks, timed, image, snapshots, cfg, funnel, tick)
    timings.add("wall_s", time.perf_counter() - start)
    log.info("synthesize %s: %d validated of %d candidates", repo_name, funnel.kept, funnel.seen,
             extra={"funnel": funnel.as_dict()})  # fmt: skip
    return validated, funnel


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


def _candidates(sources: dict[str, str], cfg: SynthesisConfig, funnel: SynthesisFunnel) -> list[Mutant]:
    everything = [m for rel in sorted(sources) for m in mutants_of_source(rel, sources[rel], cfg.families)]
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
        self.sandbox = backend.create(SandboxSpec(image=image, workspace=original, limits=limits,
                                                  labels={"purpose": "synthesize-screen"}))  # fmt: skip
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
    # The reaper removes sandboxes past their deadline: give screening sandboxes time for their whole share.
    deadline = cfg.limits.episode_timeout_s + (len(mutants) // workers + 2) * cfg.screen_timeout_s * 5
    limits = replace(cfg.limits, episode_timeout_s=deadline)
    screeners: list[Screener] = []
    try:
        with funnel.timings.measure("busy_s"):
            screeners.append(Screener(backend, image, original, limits, env))
            baseline = screeners[0].run({}, timeout=cfg.validate.test_timeout_s)
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
            kept.append(Screened(mutant, broke, report.log_tail))
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
    """The task for one screened mutant: mutated tree stored as the snapshot, the revert as the gold patch."""
    mutant = item.mutant
    tree = tmp / mutant.digest
    shutil.copytree(original, tree, symlinks=True)
    try:
        (tree / mutant.path).write_text(mutant.apply(sources[mutant.path]), encoding="utf-8")
        gold = diff_trees(tree, original)
        statement = write_statement(repo_name, item, public, changed_lines(gold))
        if statement is None:
            return None
        digest = snapshots.put(tree)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    return Task(
        task_id=f"{repo_name}-syn-{mutant.digest[:10]}",
        source=Source(kind="synthetic", ref=_ref(mutant)),
        repo=repo_name,
        snapshot=digest,
        problem_statement=statement,
        gold_patch=gold,
        test_patch="",
    )


def _validate(tasks: list[tuple[Mutant, Task]], backend: Backend, image: str, snapshots: SnapshotStore,
              cfg: SynthesisConfig, funnel: SynthesisFunnel, tick: _Ticker) -> list[Task]:  # fmt: skip
    shared = SuiteRuns()  # every task's fixed tree is the original repository: its suite runs once

    def one(task: Task) -> Task:
        with funnel.timings.measure("busy_s"):
            checked = validate_task(task, backend, image, snapshots, cfg.limits, cfg.validate, shared)
        tick("validate", len(tasks))
        return checked

    with ThreadPoolExecutor(max_workers=max(1, cfg.concurrency)) as pool:
        checked = list(pool.map(one, [task for _, task in tasks]))
    valid = []
    for (mutant, _), task in zip(tasks, checked, strict=True):
        if task.validation.valid:
            funnel.accept(mutant)
            valid.append(task)
            continue
        reason = task.validation.reason
        flaky = "flaky" in reason or bool(task.validation.flaky_tests)
        funnel.reject(mutant, "flaky" if flaky else reason.split(":", 1)[0], reason)
    return valid


# --- problem statements -----------------------------------------------------------------------


@dataclass
class Failure:
    """What pytest showed for one failing test: the test's own lines and the error lines (``E ...``)."""

    test: str
    code: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")
_FRAME = re.compile(r"^(\S+\.py):\d+: in \S+")
_FILE_LINE = re.compile(r"([\w./-]+\.py)(?::|\", line |, line )\d+")
_WHERE = re.compile(r"^E\s+\+\s+where (.+?) = (.+)$")
_ASSERT_EQ = re.compile(r"^E\s+(?:AssertionError: )?assert (.+)$")
_EXCEPTION = re.compile(r"^E\s+([A-Za-z_][\w.]*(?:Error|Exception|Warning|Exit|Interrupt))\b:?\s*(.*)$")
_NOT_RAISED = re.compile(r"DID NOT RAISE <class '(?:[\w.]*\.)?(\w+)'>")
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
MAX_SHOWN_TESTS = 10
MAX_DETAILED = 3
MAX_LINE = 160


def parse_failures(log: str, tests: Sequence[str]) -> list[Failure]:
    """Failure sections of ``pytest -q --tb=short`` output for ``tests``, library frames left out."""
    by_name = {t.split("::", 1)[-1].replace("::", "."): t for t in tests}
    failures: list[Failure] = []
    current: Failure | None = None
    in_test_frame = False
    for line in log.splitlines():
        header = _SECTION.match(line)
        if header or line.startswith(("===", "---")):
            current = None
            if header and header.group(1) in by_name:
                current = Failure(by_name[header.group(1)])
                failures.append(current)
                in_test_frame = False
            continue
        if current is None:
            continue
        frame = _FRAME.match(line)
        if frame:
            in_test_frame = is_test_path(frame.group(1))
        elif line.startswith("E "):
            current.errors.append(line.rstrip())
        elif in_test_frame and line.strip():
            current.code.append(line.rstrip())
    return failures


def public_names(sources: dict[str, str]) -> dict[str, str]:
    """Public functions, classes and methods of the library: name -> how a user would write it."""
    found: dict[str, str] = {}
    for text in sources.values():
        for match in re.finditer(r"^(class|def) ([A-Za-z]\w*)", text, re.MULTILINE):
            found.setdefault(match.group(2), match.group(2))
        for cls in re.finditer(r"^class ([A-Za-z]\w*).*?(?=^\S|\Z)", text, re.MULTILINE | re.DOTALL):
            for method in re.finditer(r"^    def ([A-Za-z]\w*)", cls.group(0), re.MULTILINE):
                found.setdefault(method.group(1), f"{cls.group(1)}.{method.group(1)}")
    return found


def changed_lines(patch: str) -> list[str]:
    """The code lines a patch removes or adds (stripped, only those with a letter or digit in them)."""
    lines = []
    for line in patch.splitlines():
        if line.startswith(("+++", "---")) or not line.startswith(("+", "-")):
            continue
        text = line[1:].strip()
        if re.search(r"\w", text):
            lines.append(text)
    return lines


def leaks(text: str, lines: Iterable[str]) -> list[str]:
    """The code lines that appear in ``text`` as whole words (``pass`` is not found in ``passing``)."""
    return [line for line in lines if re.search(rf"(?<!\w){re.escape(line)}(?!\w)", text)]


def write_statement(repo: str, item: Screened, public: dict[str, str], secret: Sequence[str]) -> str | None:
    """A user's bug report built from the failing tests; None when it cannot avoid showing ``secret`` lines."""
    failures = parse_failures(item.log, item.broke)
    shown = [_clean(f, secret, item.mutant) for f in failures[:MAX_DETAILED]]
    subject = next((s for f in shown if (s := _subject(f, public))), None)
    parts = [_title(repo, subject, shown), "", _intro(repo, item), "", f"Failing tests ({len(item.broke)}):"]
    parts += [f"- {_display(t)}" for t in item.broke[:MAX_SHOWN_TESTS]]
    if len(item.broke) > MAX_SHOWN_TESTS:
        parts.append(f"- ... and {len(item.broke) - MAX_SHOWN_TESTS} more")
    observed = next((o for f in shown if (o := _observed(f))), None)
    if observed:
        parts += ["", observed]
    output = [line for f in shown if f.code or f.errors for line in [f.test, *f.code, *f.errors, ""]]
    if output:
        parts += ["", "What the test run shows (trimmed):", "```", *output[:-1], "```"]
    parts += ["", "Expected: these tests succeed again without changing them, and the rest of the suite keeps working."]
    statement = "\n".join(parts) + "\n"
    if leaks(statement, secret) or item.mutant.family in statement or _FILE_LINE.search(_strip_tests(statement)):
        return None
    return statement


def _clean(failure: Failure, secret: Sequence[str], mutant: Mutant) -> Failure:
    """Drop lines that show changed code, name a library file position, or are too long to help."""

    def ok(line: str) -> bool:
        positions = [m.group(1) for m in _FILE_LINE.finditer(line)]
        return not leaks(line, secret) and all(is_test_path(p) for p in positions) and mutant.family not in line

    code = [_trim(line) for line in failure.code if ok(line)][-4:]
    errors = [_trim(line) for line in failure.errors if ok(line)][:6]
    return Failure(failure.test, code, errors)


def _trim(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…"


def _strip_tests(text: str) -> str:
    """``text`` without test-file positions (those are fine to show): what remains must name no file line."""
    return _FILE_LINE.sub(lambda m: "" if is_test_path(m.group(1)) else m.group(0), text)


def _display(test: str) -> str:
    return test.replace("<collection>:", "collecting ")


def _subject(failure: Failure, public: dict[str, str]) -> str | None:
    """The public function or method the failing test calls on its failing line, else the one its name mentions."""
    for line in failure.code:
        for name in _CALL.findall(line):
            if name in public:
                return public[name]
    test_name = failure.test.rsplit("::", 1)[-1]
    named = [name for name in public if re.search(rf"(?:^|_){re.escape(name)}(?:_|$|\[)", test_name)]
    return public[max(named, key=len)] if named else None


def _title(repo: str, subject: str | None, shown: list[Failure]) -> str:
    errors = [line for f in shown for line in f.errors]
    what = f"`{subject}`" if subject else f"`{repo}`"
    for line in errors:
        if missing := _NOT_RAISED.search(line):
            return f"{what} no longer raises {missing.group(1)}"
        if (exc := _EXCEPTION.match(line)) and exc.group(1) != "AssertionError":
            return f"{what} fails with {exc.group(1).rsplit('.', 1)[-1]}"
    return f"{what} gives wrong results"


_INTROS = (
    "Something in `{repo}` regressed: {count} of its own suite now {verb}.",
    "After updating to the current `{repo}` code, {count} in its test suite {verb}.",
    "`{repo}` misbehaves for me, and its test suite agrees: {count} {verb}.",
)


def _intro(repo: str, item: Screened) -> str:
    """One of a few phrasings, chosen by the mutant's digest: the same task always reads the same."""
    pick = int(item.mutant.digest, 16) % len(_INTROS)
    n = len(item.broke)
    count, verb = ("one test", "fails") if n == 1 else (f"{n} tests", "fail")
    return _INTROS[pick].format(repo=repo, count=count, verb=verb)


def _observed(failure: Failure) -> str | None:
    """'`f(x)` returns `A`, but the test expects `B`.' when the assertion output shows both sides."""
    compared = next((m.group(1) for line in failure.errors if (m := _ASSERT_EQ.match(line))), None)
    if compared is None or compared.count(" == ") != 1:
        return None
    left, right = (_short(side) for side in compared.split(" == "))
    for line in failure.errors:
        where = _WHERE.match(line)
        if where and where.group(1) in (left, right):
            expected = right if where.group(1) == left else left
            return f"`{_short(where.group(2))}` returns `{where.group(1)}`, but the test expects `{expected}`."
    shape = _assert_shape(failure.code)
    if shape is not None:
        expr, is_call, literal_on_right = shape
        got, want = (left, right) if literal_on_right else (right, left)
        verb = "returns" if is_call else "is"
        return f"`{_short(expr)}` {verb} `{got}`, but the test expects `{want}`."
    if left == right:
        return None  # pytest shortened both sides to the same text: saying they differ tells nothing
    return f"The test compares `{left}` with `{right}`, and they differ."


def _assert_shape(code: list[str]) -> tuple[str, bool, bool] | None:
    """For the test's ``assert expr == literal`` line: (expr's text, whether it is a call, literal on the right?)."""
    for line in reversed(code):
        text = line.strip()
        try:
            node = pyast.parse(text).body[0]
        except (SyntaxError, IndexError):
            continue
        test = node.test if isinstance(node, ast.Assert) else None
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            return None
        left, right = test.left, test.comparators[0]
        if _literal(left) != _literal(right):
            expr = right if _literal(left) else left
            return ast.get_source_segment(text, expr) or ast.unparse(expr), isinstance(expr, ast.Call), _literal(right)
        return None
    return None


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
