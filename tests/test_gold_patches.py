"""Zero false zeros: the gold patch of every task that validates scores 1, with no tamper evidence.

Every source of tasks goes through the real path, on the bwrap backend: validation (``validate_task``,
canaries and tamper checks included), then the real ``Grader`` on the task's gold patch.

- **bundled**: every ticket of ``tasks_src/tickets`` (the bundled GitHub export and repositories);
- **synthesized**: a seeded sample of bug-injection tasks from the bundled repositories, every family in it;
- **ingested**: every task the ingest adapters make of their test fixtures (SWE-bench, GitHub REST JSON and
  JSON lines, Jira, git history), on the repositories ``test_ingest_adapters`` builds;
- **fixtures**: ``fixtures/gold/.serialkit``, SWE-bench-style tasks whose correct fixes legitimately use what a
  word list would call tampering (``importlib``, ``sys.modules``, ``unittest.mock`` in library code,
  ``inspect.signature`` and ``inspect.stack``, ``__main__``, ``pytest`` in the package's testing helper, a
  comment naming ``unittest.mock``) and whose tests use monkeypatch, capsys, tmp_path, parametrize,
  unittest.TestCase, module-level pytestmark, a conftest with fixtures, a plugin and a
  ``pytest_collection_modifyitems`` hook, and skips for a missing optional dependency.

A false zero is a validated task whose gold patch does not score 1 (reward, status ``ok``, no
``tampered:`` flag), or a task whose validation says ``tampered:``: both are counted and must be none.
Validation runs once per task (``runs=1``) and the suite runs of one tree are shared by the whole module.
"""

from __future__ import annotations

import ast
import json
import random
import shutil
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO_ROOT
from test_ingest_adapters import FIXTURES as INGEST_FIXTURES
from test_ingest_adapters import _fill, evil, widgets  # noqa: F401 (module fixtures: the adapters' git repositories)

from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.ingest.github import ingest_github_issues
from trialforge.tasks.ingest.github_rest import ingest_github_rest
from trialforge.tasks.ingest.gitlog import ingest_git_history
from trialforge.tasks.ingest.jira import ingest_jira
from trialforge.tasks.ingest.swebench import ingest_swebench
from trialforge.tasks.mutations import FAMILIES
from trialforge.tasks.patches import diff_trees, filter_patch, is_test_path
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.synthesize import SynthesisConfig, synthesize
from trialforge.tasks.validate import SuiteRuns, ValidateConfig, validate_task
from trialforge.testrun.prepare import prepare
from trialforge.verify.grader import Grader, Verdict

TICKETS = REPO_ROOT / "tasks_src" / "tickets" / "github_issues.jsonl"
REPOS = REPO_ROOT / "tasks_src" / "repos"
BUNDLED_REPOS = ("ledgerlite", "textkit", "schedwise")
# The one bundled ticket that must not validate (tasks_src/README.md: its tests already pass on the base state).
BUNDLED_REJECTED = {"textkit-38": "no_fail_to_pass"}
SERIALKIT = Path(__file__).parent / "fixtures" / "gold" / ".serialkit"  # a dot: pytest never collects it
SERIALKIT_TASKS = sorted(json.loads((SERIALKIT / "tasks.json").read_text()))
SYNTH_SEED = 5
SYNTH_PER_REPO = 12  # candidates per repository: one per family, round-robin
MIN_SYNTHESIZED = 10
WORKERS = 2  # this machine's cores
CANARY_SEEDS = 40


@dataclass
class Graded:
    """One task's way through validation and grading, with the evidence a false zero is reported with."""

    source: str
    task: Task
    verdict: Verdict | None = None  # None: the task did not validate

    @property
    def label(self) -> str:
        return f"{self.source}:{self.task.task_id}"

    @property
    def false_zero(self) -> bool:
        if self.verdict is None:
            return self.task.validation.reason.startswith("tampered:")
        tampered = [f for f in self.verdict.flags if f.startswith("tampered:")]
        return self.verdict.reward != 1.0 or self.verdict.status != "ok" or bool(tampered)

    def evidence(self) -> str:
        v, validation = self.verdict, self.task.validation
        if v is None:
            return f"{self.label}: validation rejected it: {validation.reason}"
        failing = {t: o for t, o in v.outcomes.items() if o != "passed"}
        return (
            f"{self.label}: reward={v.reward} status={v.status} reason={v.reason!r} flags={v.flags} "
            f"not passed={failing} validation={validation.reason or 'valid'}"
        )


@pytest.fixture(scope="module")
def world(bwrap_backend, tmp_path_factory) -> SimpleNamespace:
    """One snapshot store, one grader and one pool of shared suite runs for the whole module."""
    root = tmp_path_factory.mktemp("gold")
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    image = bwrap_backend.image
    return SimpleNamespace(
        root=root,
        backend=bwrap_backend,
        image=image.name,
        snapshots=snapshots,
        grader=Grader(bwrap_backend, image.name, image.digest, snapshots, Limits()),
        shared=SuiteRuns(),
        cfg=ValidateConfig(runs=1),
        seconds={},
    )


def validate_and_grade(world: SimpleNamespace, source: str, tasks: list[Task]) -> list[Graded]:
    """Validate ``tasks`` (suite runs shared with the module), then grade each valid one's gold patch."""

    def validate(task: Task) -> Task:
        return validate_task(task, world.backend, world.image, world.snapshots, Limits(), world.cfg, world.shared)

    def grade(task: Task) -> Graded:
        verdict = world.grader.grade(task, task.gold_patch) if task.validation.valid else None
        return Graded(source, task, verdict)

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        validated = list(pool.map(validate, tasks))
        graded = list(pool.map(grade, validated))
    world.seconds[source] = world.seconds.get(source, 0.0) + time.monotonic() - start
    return graded


def assert_no_false_zeros(results: list[Graded]) -> None:
    false_zeros = [r.evidence() for r in results if r.false_zero]
    assert not false_zeros, "false zeros:\n" + "\n".join(false_zeros)


def rejections(results: list[Graded]) -> dict[str, str]:
    return {r.label: r.task.validation.reason for r in results if r.verdict is None}


# --- bundled -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundled(world) -> list[Graded]:
    tasks, _ = ingest_github_issues(TICKETS, REPOS, world.snapshots)
    return validate_and_grade(world, "bundled", tasks)


@pytest.mark.sandbox
@pytest.mark.slow
def test_every_bundled_gold_patch_scores_one(bundled) -> None:
    assert len(bundled) == 18  # 19 tickets, one closed without a fix
    assert_no_false_zeros(bundled)
    rejected = {label.split(":", 1)[1]: reason.split(":", 1)[0] for label, reason in rejections(bundled).items()}
    assert rejected == BUNDLED_REJECTED
    assert all(r.verdict.reward == 1.0 for r in bundled if r.verdict is not None)


# --- synthesized -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthesized(world) -> tuple[list[Graded], list[dict]]:
    """A seeded sample of every family over the bundled repositories: graded tasks, and synthesis's rejections."""
    cfg = SynthesisConfig(max_total=SYNTH_PER_REPO, seed=SYNTH_SEED, validate=world.cfg, concurrency=WORKERS)
    tasks: list[Task] = []
    dropped: list[dict] = []
    start = time.monotonic()
    for repo in BUNDLED_REPOS:
        made, funnel = synthesize(REPOS / repo, repo, world.backend, world.image, world.snapshots, cfg)
        tasks += made
        dropped += [d | {"repo": repo} for d in funnel.details]
    world.seconds["synthesize"] = time.monotonic() - start
    graded = []
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:  # synthesis validated them: grade only
        start = time.monotonic()
        for task, verdict in zip(tasks, pool.map(lambda t: world.grader.grade(t, t.gold_patch), tasks), strict=True):
            graded.append(Graded("synthesized", task, verdict))
    world.seconds["synthesized"] = time.monotonic() - start
    return graded, dropped


def tampered_in_synthesis(dropped: list[dict]) -> list[dict]:
    return [d for d in dropped if d["reason"] == "tampered" or d["detail"].startswith("tampered:")]


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_seeded_sample_of_synthesized_tasks_scores_one_in_every_family(synthesized) -> None:
    graded, dropped = synthesized
    assert not tampered_in_synthesis(dropped), tampered_in_synthesis(dropped)
    assert len(graded) >= MIN_SYNTHESIZED
    families = Counter(r.task.source.ref.split(":", 1)[0] for r in graded)
    assert set(families) == set(FAMILIES), f"families without a graded task: {set(FAMILIES) - set(families)}"
    assert_no_false_zeros(graded)


# --- ingested (the adapters' test fixtures) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def ingested(world, widgets, evil) -> list[Graded]:  # noqa: F811 (the fixtures imported above)
    (repo, sha), (evil_repo, evil_sha) = widgets, evil
    out = world.root / "ingest"
    out.mkdir()
    snapshots = world.snapshots
    mirrors = {"acme/widgets": repo, "acme/evil": evil_repo}
    runs = {
        "swebench": ingest_swebench(
            _fill(INGEST_FIXTURES / "swebench.jsonl", out / "swebench.jsonl", {**sha, **evil_sha}), mirrors, snapshots
        ),
        "github_rest": ingest_github_rest(
            _fill(INGEST_FIXTURES / "github_export.json", out / "github_export.json", sha), mirrors, snapshots
        ),
        "github_rest_jsonl": ingest_github_rest(
            _fill(INGEST_FIXTURES / "github_export.jsonl", out / "github_export.jsonl", sha), mirrors, snapshots
        ),
        "jira": ingest_jira(INGEST_FIXTURES / "jira_export.csv", repo, snapshots, repo_name="widgets"),
        "gitlog": ingest_git_history(repo, snapshots, repo_name="widgets", max_changed_lines=200),
        "gitlog_evil": ingest_git_history(evil_repo, snapshots),
    }
    results = []
    for adapter, (tasks, _) in runs.items():
        results += validate_and_grade(world, f"ingested/{adapter}", tasks)
    return results


@pytest.mark.sandbox
@pytest.mark.slow
def test_every_ingested_task_that_validates_scores_one(ingested) -> None:
    by_adapter = Counter(r.source.split("/", 1)[1] for r in ingested)
    assert by_adapter == {"swebench": 2, "github_rest": 2, "github_rest_jsonl": 1, "jira": 4, "gitlog": 3}
    assert_no_false_zeros(ingested)
    assert sum(r.verdict is not None for r in ingested) >= 10, rejections(ingested)


# --- fixtures: legitimate fixes that a word list would call tampering --------------------------------------


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo), "PATH": "/usr/bin:/bin"}
    names = {"GIT_AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "ada@example.com", "GIT_AUTHOR_DATE": "2024-05-01T10:00Z"}
    env |= names | {k.replace("AUTHOR", "COMMITTER"): v for k, v in names.items()}
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip()


def serialkit_instances(root: Path) -> tuple[Path, Path]:
    """The serialkit repository at its base commit, and a SWE-bench file with one instance per fixture task.

    A task's fixed tree is the base with ``tasks/<name>/`` laid over it; its patch and test patch are the
    diff between the two, split by path.
    """
    repo = root / "serialkit"
    shutil.copytree(SERIALKIT / "base", repo)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "serialkit 0.3.0")
    base_commit = _git(repo, "rev-parse", "HEAD")
    statements = json.loads((SERIALKIT / "tasks.json").read_text())
    lines = []
    for number, name in enumerate(SERIALKIT_TASKS, start=1):
        fixed = root / "fixed" / name
        shutil.copytree(SERIALKIT / "base", fixed)
        shutil.copytree(SERIALKIT / "tasks" / name, fixed, dirs_exist_ok=True)
        diff = diff_trees(SERIALKIT / "base", fixed)
        instance = {
            "repo": "serialkit/serialkit",
            "instance_id": f"serialkit__{name}-{number}",
            "base_commit": base_commit,
            "patch": filter_patch(diff, lambda p: not is_test_path(p))[0],
            "test_patch": filter_patch(diff, is_test_path)[0],
            "problem_statement": statements[name],
        }
        lines.append(json.dumps(instance))
    path = root / "serialkit.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return repo, path


@pytest.fixture(scope="module")
def fixture_tasks(world) -> dict[str, Graded]:
    repo, path = serialkit_instances(world.root / "serialkit-src")
    tasks, funnel = ingest_swebench(path, {"serialkit/serialkit": repo}, world.snapshots)
    assert funnel.kept == len(SERIALKIT_TASKS), funnel.details
    graded = validate_and_grade(world, "fixtures", tasks)
    return {r.task.task_id.split("__", 1)[1].rsplit("-", 1)[0]: r for r in graded}


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.parametrize("name", SERIALKIT_TASKS)
def test_a_legitimate_fix_that_looks_like_tampering_validates_and_scores_one(fixture_tasks, name) -> None:
    result = fixture_tasks[name]
    assert result.task.validation.valid, result.evidence()
    assert result.task.fail_to_pass, result.evidence()
    assert_no_false_zeros([result])


def _collectable(source: str, node_path: str) -> bool:
    """``node_path`` (``name`` or ``Class::name``) names a test function pytest collects from ``source``."""
    module = ast.parse(source)
    *holder, name = node_path.split("::")
    body = module.body
    if holder:
        classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == holder[0]]
        body = classes[0].body if classes else []
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in body)


def _test_modules(tree: str) -> dict[str, str]:
    """Relative path -> text of every test module of a bundled repository or a fixture task's fixed tree."""
    layers = [REPOS / tree] if tree in BUNDLED_REPOS else [SERIALKIT / "base", SERIALKIT / "tasks" / tree]
    return {p.relative_to(d).as_posix(): p.read_text() for d in layers for p in sorted(d.rglob("test_*.py"))}


@pytest.mark.pure
@pytest.mark.parametrize("tree", [*BUNDLED_REPOS, *SERIALKIT_TASKS])
def test_every_canary_planted_in_an_honest_test_module_is_collectable(tree, tmp_path) -> None:
    """A canary that lands inside another test is never collected and reads as ``canary_missing``: a false zero.

    Planted as validation plants them (any test may be copied), over ``CANARY_SEEDS`` seeds per module.
    """
    lost = []
    for rel, text in _test_modules(tree).items():
        for seed in range(CANARY_SEEDS):
            work = tmp_path / f"{seed}-{rel.replace('/', '-')}"
            (work / rel).parent.mkdir(parents=True)
            (work / rel).write_text(text)
            guard = prepare(work, [], [rel], plant_in=[rel], rng=random.Random(seed))
            planted = (work / rel).read_text()
            lost += [f"seed {seed}: {c.node_id} ({c.kind})" for c in guard.canaries
                     if not _collectable(planted, c.node_id.split("::", 1)[1])]  # fmt: skip
    assert not lost, f"{len(lost)} canaries pytest cannot collect:\n" + "\n".join(lost)


# --- the count ---------------------------------------------------------------------------------------------


@pytest.mark.sandbox
@pytest.mark.slow
def test_zero_false_zeros_over_every_gold_patch(bundled, synthesized, ingested, fixture_tasks, world, capsys) -> None:
    graded_synth, dropped = synthesized
    results = [*bundled, *graded_synth, *ingested, *fixture_tasks.values()]
    graded = [r for r in results if r.verdict is not None]
    scored_one = [r for r in graded if r.verdict.reward == 1.0]
    false_zeros = [r for r in results if r.false_zero] + [
        SimpleNamespace(evidence=lambda d=d: f"synthesized:{d['ref']}: {d['detail']}")
        for d in tampered_in_synthesis(dropped)
    ]
    rejected = rejections(results)
    synth_rejected = Counter(d["reason"] for d in dropped)
    with capsys.disabled():
        print(f"\ngold patches graded: {len(graded)} (by source: {dict(Counter(r.source for r in graded))})")
        print(f"scored 1: {len(scored_one)}; false zeros: {len(false_zeros)}")
        print(f"validation rejections: {len(rejected)}")
        for label, reason in sorted(rejected.items()):
            print(f"  {label}: {reason[:160]}")
        print(f"synthesis drops (candidates that never became tasks): {dict(synth_rejected)}")
        print(f"seconds: { {k: round(v, 1) for k, v in world.seconds.items()} }")
        for source, figures in host_judged_by_source(graded).items():
            print(f"host-judged {source}: {figures}")
        for r in false_zeros:
            print(f"FALSE ZERO {r.evidence()}")
    assert not false_zeros, "\n".join(r.evidence() for r in false_zeros)
    assert len(scored_one) == len(graded) >= 17 + MIN_SYNTHESIZED + 10 + len(SERIALKIT_TASKS)
    assert not [r for r in rejected.values() if r.startswith("tampered:")]
    shares = host_judged_by_source(graded)
    # Nine in ten fail-to-pass tests of bundled tasks are judged on the host (their expected values never enter the
    # sandbox); of synthesized ones, whose failing tests are the repositories' own, 134 of 158: the rest compare two
    # values the code computes (a relation), ask the package's own container for membership, or record a side that
    # moves with the fix, which stays in process (docs/verification.md).
    assert shares["bundled"]["fail_to_pass_share"] >= 0.9, shares
    assert shares["synthesized"]["fail_to_pass_share"] >= 0.84, shares


def host_judged_by_source(graded: list[Graded]) -> dict[str, dict[str, float | int]]:
    """Fail-to-pass tests and assertions judged on the host, by task source (bundled, synthesized, ingested...)."""
    found: dict[str, dict[str, float | int]] = {}
    for source in sorted({r.source.split("/")[0] for r in graded}):
        records = [r.task.validation.host_judged for r in graded if r.source.split("/")[0] == source]
        assert all(records), f"{source}: a validated task without its host-judged record"
        f2p, judged = sum(h.fail_to_pass for h in records), sum(h.fail_to_pass_host_judged for h in records)
        asserts, asserts_judged = sum(h.assertions for h in records), sum(h.assertions_host_judged for h in records)
        found[source] = {
            "fail_to_pass": f2p,
            "fail_to_pass_share": round(judged / f2p, 3) if f2p else 0.0,
            "assertions": asserts,
            "assertion_share": round(asserts_judged / asserts, 3) if asserts else 0.0,
            "in_process_slots": sum(len(h.in_process) for h in records),
        }
    return found
