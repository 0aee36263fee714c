"""Acceptance on code no one here wrote: fix commits of public repositories, end to end on both backends.

    PYTHONPATH=src .venv/bin/python benchmarks/realrepos.py [--corpus tuning|held-out] [--mirrors DIR]
                                                            [--repo NAME=PATH_OR_URL ...] [--max-instances 5]
                                                            [--runs 2] [--test-timeout 120] [--max-duration 900]
                                                            [--backends bwrap,docker] [--rebuild] [--quick]

``--corpus`` takes one half of the corpus (benchmarks/realrepos_corpus.toml, chosen before the work it
measures) from its mirrors (``DIR/OWNER+NAME/repo``); ``--repo`` adds any other repository.
For each repository (a local git mirror or a clone URL; nothing of it is kept in this repository):
mine fix commits from its history (``ingest_git_history``, the most recent ``--max-instances`` that
pass ingestion's filters), detect and build its environment image (``provide_images``), then on
every backend validate each instance (fail-to-pass before/after the fix, ``--runs`` runs each, time limits sized to
the suite between ``--test-timeout`` and ``--max-duration``: docs/pipeline.md, "Time limits") and
grade the gold patch (must score 1) and the empty diff (must score 0). Prints per repository and
backend: instances, valid, accepted (valid, gold 1, empty 0, and kept by the quality gate's host-judged rule, so
a task the pipeline would never train is not counted as one it would), the valid tasks' fail-to-pass tests
judged on the host entirely and anchored (docs/verification.md), their assertions judged on the host, rejected
by reason, the rejections that are the
product's fault and the share of real fixes accepted (both from the judgments read in
benchmarks/realrepos_judgments.toml: a rejection no one has judged yet is counted ``unjudged``), seconds
spent building the environment, validating and grading; then the ingest funnel, every rejection with its
detail and judgment, and whether the two backends agreed.

``--rebuild`` drops this run's environment images from the cache first, so the build time is a cold
one. Everything else the run makes (clones, snapshots, sandboxes, the Podman service and the images it
imported into the engine) is removed at the end; built environment images stay in the cache.
docs/realrepos.md has the measured output and what each rejection says about trialforge.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import signal
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from rich.console import Console
from rich.table import Table

from trialforge.funnel import Funnel
from trialforge.quality.gate import host_judged_problem
from trialforge.quality.settings import QualityConfig
from trialforge.sandbox.base import Backend, Limits
from trialforge.sandbox.images import ENV_REPO, base_image, cache_root
from trialforge.store.objstore import open_store
from trialforge.tasks.envdetect.decide import EnvError
from trialforge.tasks.envdetect.resolve import resolve_env
from trialforge.tasks.envimages import BuiltImage, env_key, provide_images, task_image
from trialforge.tasks.ingest.git import Mirrors, git
from trialforge.tasks.ingest.gitlog import ingest_git_history
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import SuiteRuns, ValidateConfig, validate_task
from trialforge.verify.grader import Grader

# The repositories are the caller's (mirrors or clone URLs), never named here; docs/realrepos.md has the three
# measured and their shapes: a src/ layout with no runtime dependency (python-semver), pure-Python runtime
# dependencies from the package index (environs: marshmallow, python-dotenv), a compiled dependency installed from
# a wheel (mako: MarkupSafe's speedups).
# Environment overrides (params.yaml's ``env.repos`` shape) for repositories detection gets wrong; each with why.
OVERRIDES: dict[str, dict[str, Any]] = {}
LIMITS = Limits(cpus=1.0, memory_mb=1024, pids=256, disk_mb=256)
HERE = Path(__file__).parent
CORPUS = HERE / "realrepos_corpus.toml"
JUDGMENTS = HERE / "realrepos_judgments.toml"
MIRRORS = Path("/work/.mirror")
# The goals (#45), on each half of the corpus.
GOAL_REAL_FIXES_ACCEPTED = 0.70
GOAL_PRODUCT_AT_FAULT = 0.10


# --- the corpus and the judgments -------------------------------------------------------------------------


def corpus_repos(half: str, mirrors: Path, corpus: Path = CORPUS) -> dict[str, str]:
    """One half of the corpus (``tuning``: ``held_out = false``; ``held-out``), each name's mirror by its short name."""
    entries = tomllib.loads(corpus.read_text())["repo"]
    chosen = [e["name"] for e in entries if e["held_out"] == (half == "held-out")]
    repos = {name.split("/", 1)[1]: mirrors / name.replace("/", "+", 1) / "repo" for name in chosen}
    missing = [str(path) for path in repos.values() if not path.is_dir()]
    if missing:
        raise SystemExit(f"--corpus {half}: no mirror at {', '.join(missing)} (--mirrors DIR holds OWNER+NAME/repo)")
    return {name: str(path) for name, path in repos.items()}


class Judgment(BaseModel):
    """One rejection, judged by reading the case: whose fault it is, whether the commit fixes anything, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    task: str
    reason: str  # the rejection reason judged (``validate/no_fail_to_pass``); another reason is a new case
    fault: Literal["product", "commit", "env-upstream"]
    real_fix: bool  # false: the commit is no fix its tests show (nothing to accept), left out of the share
    why: str


def load_judgments(path: Path = JUDGMENTS) -> dict[tuple[str, str], Judgment]:
    """The judgments file, by (task id, reason); a malformed file is a one-line error."""
    try:
        entries = tomllib.loads(path.read_text()).get("judgment", [])
        judged = [Judgment.model_validate(entry) for entry in entries]
    except (OSError, tomllib.TOMLDecodeError, ValidationError) as exc:
        raise SystemExit(f"{path}: {' '.join(str(exc).split())}") from None
    return {(j.task, j.reason): j for j in judged}


@dataclass
class Tally:
    """Rejections by whose fault they are, and how many instances are real fixes, on one backend."""

    faults: Counter[str] = field(default_factory=Counter)  # product, commit, env-upstream, unjudged
    not_fixes: int = 0

    def add(self, other: Tally) -> None:
        self.faults.update(other.faults)
        self.not_fixes += other.not_fixes


def tally(rejections: list[tuple[str, str, str]], judgments: dict[tuple[str, str], Judgment]) -> Tally:
    t = Tally()
    for task_id, reason, _ in rejections:
        judged = judgments.get((task_id, reason))
        t.faults[judged.fault if judged else "unjudged"] += 1
        t.not_fixes += bool(judged and not judged.real_fix)
    return t


def verdict(judged: Judgment | None) -> str:
    if judged is None:
        return "unjudged"
    return f"{judged.fault}{'' if judged.real_fix else ', not a real fix'}: {judged.why}"


def product_at_fault(t: Tally) -> str:
    """``product of rejections (share)``, and the rejections still to read."""
    rejected = sum(t.faults.values())
    if not rejected:
        return "-"
    text = f"{t.faults['product']}/{rejected} ({t.faults['product'] / rejected:.0%})"
    return text + (f", {t.faults['unjudged']} unjudged" if t.faults["unjudged"] else "")


def real_fixes_accepted(accepted: int, instances: int, t: Tally) -> str:
    """``accepted of the instances that are real fixes (share)``: an unjudged rejection counts as a real fix."""
    real = instances - t.not_fixes
    return f"{accepted}/{real} ({accepted / real:.0%})" if real else "-"


def goals(accepted: int, instances: int, t: Tally) -> str:
    """The issue's two goals on what was measured: met, or not, with the figures."""
    real = instances - t.not_fixes
    rejected = sum(t.faults.values())
    share = accepted / real if real else 0.0
    fault = t.faults["product"] / rejected if rejected else 0.0
    lines = [
        f"real fixes accepted {accepted}/{real} ({share:.0%}), goal >= {GOAL_REAL_FIXES_ACCEPTED:.0%}: "
        + ("met" if share >= GOAL_REAL_FIXES_ACCEPTED else "NOT met"),
        f"product at fault {t.faults['product']}/{rejected} of rejections ({fault:.0%}), goal <= "
        f"{GOAL_PRODUCT_AT_FAULT:.0%}: " + ("met" if fault <= GOAL_PRODUCT_AT_FAULT else "NOT met"),
    ]
    if t.faults["unjudged"]:
        lines.append(f"{t.faults['unjudged']} rejections unjudged: read them and record them in {JUDGMENTS.name}")
    return "\n".join(lines)


@dataclass
class BackendResult:
    valid: int = 0
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    details: list[tuple[str, str, str]] = field(default_factory=list)  # task id, reason, detail
    verdicts: dict[str, tuple[bool, tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    judged: Counter[str] = field(default_factory=Counter)  # host-judged tests and assertions of the valid tasks
    validate_s: float = 0.0
    grade_s: float = 0.0

    def reject(self, task_id: str, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        self.details.append((task_id, reason, detail))


@dataclass
class RepoResult:
    name: str
    rev: str
    ingest: Funnel
    instances: int
    env: Funnel
    images: list[BuiltImage]
    env_s: float
    backends: dict[str, BackendResult] = field(default_factory=dict)


# --- the steps -----------------------------------------------------------------------------------------


def recent_instances(
    mirror: Path, name: str, snapshots: SnapshotStore, n: int, overrides: dict[str, dict[str, Any]]
) -> tuple[list[Task], Funnel, str]:
    """The ``n`` most recent commits ingestion keeps: a window of first-parent history, widened until it holds ``n``."""
    depth = int(git(mirror, "rev-list", "--first-parent", "--count", "HEAD").decode())
    window = 8 * n
    while True:
        rev = "HEAD" if window >= depth else f"HEAD~{window}..HEAD"
        tasks, funnel = ingest_git_history(mirror, snapshots, repo_name=name, rev=rev, env_overrides=overrides)
        if len(tasks) >= n or rev == "HEAD":
            return tasks[-n:], funnel, rev  # oldest first: the last ones are the most recent
        window *= 4


def environments(
    tasks: list[Task], snapshots: SnapshotStore, overrides: dict[str, dict[str, Any]], rebuild: bool
) -> tuple[list[Task], Funnel, list[BuiltImage], float]:
    """Provide every task's image; with ``rebuild``, the cached images of their specs are dropped first."""
    if rebuild:
        for snapshot, repo in {task.snapshot: task.repo for task in tasks}.items():
            forget_image(snapshot, repo, snapshots, overrides)
    start = time.monotonic()
    provided, funnel, built = provide_images(tasks, snapshots, overrides)
    return provided, funnel, built, time.monotonic() - start


def forget_image(snapshot: str, repo: str, snapshots: SnapshotStore, overrides: dict[str, dict[str, Any]]) -> None:
    """Remove the cached environment image of this tree's spec (what ``provide_images`` would detect)."""
    try:
        spec = resolve_env(snapshots.materialize(snapshot), repo, overrides)
    except EnvError:
        return  # provide_images reports it
    if not spec.is_base():
        shutil.rmtree(cache_root() / "envs" / env_key(spec), ignore_errors=True)


def check(
    tasks: list[Task], backend: Backend, snapshots: SnapshotStore, cfg: ValidateConfig, console: Console
) -> BackendResult:
    """Validate each task on ``backend``, then grade its gold patch (must be 1) and the empty diff (must be 0)."""
    result = BackendResult()
    default = base_image()
    grader = Grader(backend, default.name, default.digest, snapshots, LIMITS, suite=cfg)
    shared = SuiteRuns()
    for task in tasks:
        start = time.monotonic()
        try:
            image = task_image(task, backend, default.name)
            checked = validate_task(task, backend, image.name, snapshots, LIMITS, cfg, shared)
        except Exception as exc:  # infrastructure or a crash, not the task: say so, go on
            result.reject(task.task_id, f"error/{type(exc).__name__}", f"validating: {exc}")
            console.print(f"  {backend.name} {task.task_id}: {type(exc).__name__} while validating")
            continue
        finally:
            result.validate_s += time.monotonic() - start
        v = checked.validation
        result.verdicts[task.task_id] = (v.valid, tuple(checked.fail_to_pass), tuple(checked.pass_to_pass))
        if not v.valid:
            result.reject(task.task_id, "validate/" + v.reason.split(":", 1)[0], v.reason)
            console.print(f"  {backend.name} {task.task_id}: invalid ({v.reason.split(':', 1)[0]})")
            continue
        result.valid += 1
        if v.host_judged is not None:
            h = v.host_judged
            result.judged.update(f2p=h.fail_to_pass, f2p_host=h.fail_to_pass_host_judged, asserts=h.assertions,
                                 asserts_host=h.assertions_host_judged, anchored=h.fail_to_pass,
                                 anchored_host=h.fail_to_pass_anchored)  # fmt: skip
        start = time.monotonic()
        try:
            gold = grader.grade(checked, checked.gold_patch)
            empty = grader.grade(checked, "")
        except Exception as exc:  # one crash is one rejection, not the end of the measurement
            result.reject(task.task_id, f"error/{type(exc).__name__}", f"grading: {exc}")
            console.print(f"  {backend.name} {task.task_id}: {type(exc).__name__} while grading")
            continue
        finally:
            result.grade_s += time.monotonic() - start
        marked = ", underspecified" if checked.statement and checked.statement.underspecified else ""
        console.print(f"  {backend.name} {task.task_id}: valid, {len(checked.fail_to_pass)} fail-to-pass "
                      f"({v.fail_to_pass_units} units){marked}, gold {gold.reward}, empty {empty.reward}")  # fmt: skip
        if gold.reward != 1.0:
            result.reject(task.task_id, f"grade/gold={gold.reward}", f"{gold.status}: {gold.reason}")
        elif empty.reward != 0.0:
            result.reject(task.task_id, f"grade/empty={empty.reward}", f"{empty.status}: {empty.reason}")
        elif problem := host_judged_problem(checked, QualityConfig()):  # the pipeline's default gate drops it
            result.reject(task.task_id, "quality/host_judged", problem)
        else:
            result.accepted += 1
    return result


def run_repo(name: str, source: str, backends: list[Backend], snapshots: SnapshotStore, clones: Path,
             args: argparse.Namespace, console: Console) -> RepoResult:  # fmt: skip
    with Mirrors({name: source}, clones) as mirrors:
        tasks, ingested, rev = recent_instances(mirrors.get(name), name, snapshots, args.max_instances, OVERRIDES)
    console.print(f"{name}: {len(tasks)} instances from {rev} ({ingested.kept} of {ingested.seen} commits ingested)")
    provided, env, images, env_s = environments(tasks, snapshots, OVERRIDES, args.rebuild)
    for image in images:
        console.print(f"  image {image.image.name} ({'built' if image.built else 'cached'}, {image.seconds:.1f}s)")
    result = RepoResult(name, rev, ingested, len(tasks), env, images, env_s)
    cfg = ValidateConfig(runs=args.runs, test_timeout_s=args.test_timeout, max_duration_s=args.max_duration)
    for backend in backends:
        checked = check(provided, backend, snapshots, cfg, console)
        for detail in env.details:
            checked.reject(detail["ref"], "env/" + detail["reason"], detail["detail"])
        result.backends[backend.name] = checked
    return result


# --- backends --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def open_backends(names: list[str]) -> Iterator[list[Backend]]:
    """The named backends over the base image; the Podman service and what it imported are gone on exit."""
    image = base_image()
    with contextlib.ExitStack() as stack:
        found: list[Backend] = []
        for name in names:
            if name == "bwrap":
                from trialforge.sandbox.bwrap.backend import BwrapBackend

                bwrap = BwrapBackend(image)
                stack.callback(bwrap.close)
                found.append(bwrap)
            elif name == "docker":
                from trialforge.sandbox.container.backend import DockerBackend
                from trialforge.sandbox.container.engine import PodmanService, engine_client

                service = stack.enter_context(PodmanService())
                client = engine_client(service.base_url)
                stack.callback(client.close)
                before = {i["Id"] for i in client.api.images()}
                stack.callback(_remove_imported, client, before)
                docker = DockerBackend(client, image)
                stack.callback(docker.close)
                found.append(docker)
            else:
                raise SystemExit(f"unknown backend {name!r}: bwrap or docker")
        yield found


def _remove_imported(client: Any, before: set[str]) -> None:
    """Remove the environment images this run imported into the engine (the base image stays: it was there)."""
    for image in client.api.images():
        tags = image.get("RepoTags") or []
        if image["Id"] not in before and any(t.startswith(ENV_REPO + ":") for t in tags):
            with contextlib.suppress(Exception):  # still used by someone else's container: it stays
                client.api.remove_image(image["Id"])


# --- the report --------------------------------------------------------------------------------------------


def summary_table(results: list[RepoResult], judgments: dict[tuple[str, str], Judgment]) -> tuple[Table, str]:
    """The table, and the goals as measured on the whole run (every backend's pairs together)."""
    table = Table(title="Fix commits of public repositories, per backend")
    columns = ("repository", "backend", "instances", "image ok", "valid", "accepted", "real fixes accepted",
               "product at fault", "f2p host-judged", "f2p anchored", "asserts host-judged", "env s", "validate s",
               "grade s", "rejected by reason")  # fmt: skip
    for name in columns:
        table.add_column(name, justify="left" if name in ("repository", "backend", "rejected by reason") else "right")
    totals: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    faults = Tally()
    for r in results:
        seconds["env"] += r.env_s
        for backend, b in r.backends.items():
            built = "built" if any(i.built for i in r.images) else "cached"
            t = tally(b.details, judgments)
            faults.add(t)
            table.add_row(r.name, backend, str(r.instances), str(r.env.kept), str(b.valid), str(b.accepted),
                          real_fixes_accepted(b.accepted, r.instances, t), product_at_fault(t),
                          _share(b.judged, "f2p"), _share(b.judged, "anchored"), _share(b.judged, "asserts"),
                          f"{r.env_s:.1f} ({built})", f"{b.validate_s:.1f}", f"{b.grade_s:.1f}",
                          _reasons(b.rejected))  # fmt: skip
            totals.update(instances=r.instances, images=r.env.kept, valid=b.valid, accepted=b.accepted)
            totals.update({f"judged:{k}": n for k, n in b.judged.items()})
            totals.update(b.rejected)
            seconds["validate"] += b.validate_s
            seconds["grade"] += b.grade_s
    reasons = Counter({k: v for k, v in totals.items() if "/" in k})
    judged = Counter({k.removeprefix("judged:"): n for k, n in totals.items() if k.startswith("judged:")})
    table.add_row("TOTAL", "", str(totals["instances"]), str(totals["images"]), str(totals["valid"]),
                  str(totals["accepted"]), real_fixes_accepted(totals["accepted"], totals["instances"], faults),
                  product_at_fault(faults), _share(judged, "f2p"), _share(judged, "anchored"),
                  _share(judged, "asserts"), f"{seconds['env']:.1f}", f"{seconds['validate']:.1f}",
                  f"{seconds['grade']:.1f}", _reasons(reasons), style="bold")  # fmt: skip
    return table, goals(totals["accepted"], totals["instances"], faults)


def _share(counts: Counter[str], what: str) -> str:
    """``judged of all (share)``: of the valid tasks' fail-to-pass tests, those judged on the host entirely (``f2p``)
    or with one expected value no one could guess (``anchored``); or of their assertions, those judged on the host."""
    whole = counts[what]
    return f"{counts[what + '_host']}/{whole} ({counts[what + '_host'] / whole:.0%})" if whole else "-"


def _reasons(counts: Counter[str]) -> str:
    return ", ".join(f"{reason}: {n}" for reason, n in counts.most_common()) or "-"


def _clip(detail: str, head: int = 200, tail: int = 400) -> str:
    """One line: a long detail's start (what failed) and end (why: a build log's last lines)."""
    text = " ".join(detail.split())
    return text if len(text) <= head + tail else f"{text[:head]} [...] {text[-tail:]}"


def details(results: list[RepoResult], judgments: dict[tuple[str, str], Judgment], console: Console) -> None:
    for r in results:
        console.print(f"\n[bold]{r.name}[/bold]: ingest of {r.rev}: {r.ingest.kept} of {r.ingest.seen} commits kept; "
                      f"dropped {_reasons(r.ingest.dropped)}")  # fmt: skip
        for image in r.images:
            console.print(f"  env {image.image.name}: {image.spec.model_dump(exclude_defaults=True)}")
        for backend, b in r.backends.items():
            for task_id, reason, detail in b.details:
                console.print(f"  {backend} {task_id} {reason}: {_clip(detail)}", markup=False)
                console.print(f"    judged {verdict(judgments.get((task_id, reason)))}", markup=False)
        if len(r.backends) > 1:
            verdicts = [b.verdicts for b in r.backends.values()]
            differ = sorted(t for t in verdicts[0] if any(v.get(t) != verdicts[0][t] for v in verdicts[1:]))
            agree = "yes" if not differ else "NO: " + ", ".join(differ)
            console.print(f"  backends agree on every verdict and test list: {agree}")


def parse_repos(specs: list[str], corpus: dict[str, str]) -> dict[str, str]:
    if not specs and not corpus:
        raise SystemExit(
            "give the repositories: --corpus tuning or --repo NAME=PATH_OR_URL; docs/realrepos.md has the runs"
        )
    repos = dict(corpus)
    for spec in specs:
        name, sep, source = spec.partition("=")
        if not sep or not name or not source:
            raise SystemExit(f"--repo {spec!r}: expected NAME=PATH_OR_URL")
        repos[name] = source
    return repos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=("tuning", "held-out"), help=f"one half of {CORPUS.name}")
    parser.add_argument("--mirrors", type=Path, default=MIRRORS, help="the corpus's mirrors: DIR/OWNER+NAME/repo")
    parser.add_argument("--repo", action="append", default=[], metavar="NAME=PATH_OR_URL",
                        help="a git mirror or clone URL (repeatable)")  # fmt: skip
    parser.add_argument("--max-instances", type=int, default=5, help="most recent ingested fix commits per repository")
    parser.add_argument("--runs", type=int, default=2, help="validation runs per configuration (flaky detection)")
    parser.add_argument("--test-timeout", type=float, default=120.0,
                        help="validate.test_timeout_s: the least a task's own time limit is")  # fmt: skip
    parser.add_argument("--max-duration", type=float, default=ValidateConfig().max_duration_s,
                        help="validate.max_duration_s: the suite's measuring run may take this long")  # fmt: skip
    parser.add_argument("--backends", default="bwrap,docker")
    parser.add_argument("--rebuild", action="store_true", help="rebuild environment images found in the cache")
    parser.add_argument("--quick", action="store_true", help="2 instances per repository, 1 run each")
    args = parser.parse_args()
    if args.quick:
        args.max_instances, args.runs = 2, 1
    logging.basicConfig(level=logging.WARNING)
    # `kill` must unwind like Ctrl-C, so every sandbox is closed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    console = Console()
    if not console.is_terminal:
        console.width = 320  # a log file: do not squeeze the tables
    repos = parse_repos(args.repo, corpus_repos(args.corpus, args.mirrors) if args.corpus else {})
    load_judgments()  # a malformed file fails now, not after the run
    results = []
    start = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="tf-bench-realrepos-") as tmp,
        open_backends(args.backends.split(",")) as backends,
    ):
        snapshots = SnapshotStore(open_store(f"file://{tmp}/store"), Path(tmp) / "cache")
        for name, source in repos.items():
            results.append(run_repo(name, source, backends, snapshots, Path(tmp) / "clones", args, console))
    judgments = load_judgments()  # again: cases read while the run went on count
    table, measured = summary_table(results, judgments)
    console.print(table)
    details(results, judgments, console)
    console.print(f"\nwall {time.monotonic() - start:.0f}s for {len(results)} repositories "
                  f"({args.max_instances} instances at most each, {args.runs} runs per validation)")  # fmt: skip
    console.print(measured, markup=False)


if __name__ == "__main__":
    main()
