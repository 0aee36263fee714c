"""Bug synthesis on public repositories: validated tasks per CPU-hour, with and without the PR mirror.

    PYTHONPATH=src .venv/bin/python benchmarks/synthesis_realrepos.py [--repos OWNER/NAME ...] [--count 20]
                                  [--candidates N] [--mirrors /work/.mirror] [--runs 3] [--metrics PATH]
                                  [--configs families families+pr_mirror pr_mirror]

For each repository of the corpus's tuning half (``benchmarks/realrepos_corpus.toml``, ``held_out = false``;
a held-out one is refused), from its local mirror (``MIRRORS/OWNER+NAME/repo``): build its environment image
(timed apart, before anything is measured), then synthesize once per ``--configs``, as ``trialforge synthesize``
does (``synthesize_repository``): by default the baseline with the mutation families only, then with the PR
mirror's reverted hunks of real fixes added (``pr_mirror``: those alone), the same ``--count`` (validated tasks
wanted) and candidate budget each. Prints per
repository and configuration: candidates per family, kept by the suite (broke a test), validated, the CPU-seconds
spent (this process and every child it waited for, plus what each sandbox's own cgroup counted), the sandbox
seconds (lifecycle and test execution, summed over workers) and validated tasks per CPU-hour; then the funnel per
family. A validated task counts as kept when the pipeline's default quality gate would train it (the host-judged
rule, read from its validation record). Screening shares one sandbox per worker across candidates and validation
shares the fixed tree's suite runs (tasks/synthesize.py). docs/synthesis.md has the measured output.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import signal
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ingest import family_table
from rich.console import Console
from rich.table import Table

from trialforge.quality.gate import host_judged_problem
from trialforge.quality.settings import QualityConfig
from trialforge.sandbox.bwrap.backend import BwrapBackend
from trialforge.sandbox.images import base_image
from trialforge.scratch import scratch_dir
from trialforge.store.objstore import open_store
from trialforge.tasks.envdetect.resolve import resolve_env
from trialforge.tasks.envimages import env_image
from trialforge.tasks.ingest.git import resolve_commit
from trialforge.tasks.ingest.prmirror import FAMILY
from trialforge.tasks.ingest.synthesized import synthesize_repository
from trialforge.tasks.ingest.trees import materialize
from trialforge.tasks.mutations import FAMILIES
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.synthesize import SynthesisConfig, SynthesisFunnel, Synthesizer
from trialforge.tasks.validate import ValidateConfig

CORPUS = Path(__file__).with_name("realrepos_corpus.toml")
DEFAULT_REPOS = ("pallets/itsdangerous", "gweis/isodate", "jmespath/jmespath.py")
CONFIGS = {  # name -> (mutation families, PR mirror)
    "families": (tuple(FAMILIES), False),
    "families+pr_mirror": (tuple(FAMILIES), True),
    "pr_mirror": ((), True),  # the PR mirror's own yield: balanced sampling gives it 1 candidate in 13 above
}


@dataclass
class Measured:
    repo: str
    config: str
    funnel: SynthesisFunnel
    host_cpu_s: float  # this process and the children it waited for
    gate_kept: int  # validated tasks the pipeline's default quality gate keeps (host-judged rule)

    @property
    def cpu_s(self) -> float:
        return self.host_cpu_s + self.funnel.timings.sandbox_cpu_s  # a sandbox's processes are not our children

    def row(self) -> dict:
        totals, t = self.funnel.stage_totals(), self.funnel.timings
        return {
            "repo": self.repo,
            "config": self.config,
            "candidates": dict(sorted((f, r["candidates"]) for f, r in self.funnel.by_family().items())),
            "broke_test": totals["broke_test"],
            "validated": totals["validated"],
            "cpu_s": round(self.cpu_s, 1),
            "host_cpu_s": round(self.host_cpu_s, 1),
            "sandbox_cpu_s": round(t.sandbox_cpu_s, 1),
            "sandbox_s": round(t.sandbox_s + t.tests_s, 1),
            "wall_s": round(t.wall_s, 1),
            "tasks_per_cpu_hour": round(totals["validated"] / (self.cpu_s / 3600), 1) if self.cpu_s else 0.0,
            "gate_kept": self.gate_kept,
            "gate_kept_per_cpu_hour": round(self.gate_kept / (self.cpu_s / 3600), 1) if self.cpu_s else 0.0,
            "pr_mirror_validated": self.funnel.reached.get(FAMILY, {}).get("validated", 0),
        }


def tuning_repos(names: list[str]) -> list[str]:
    """``names`` when each is in the corpus's tuning half; a held-out or unknown name ends the run."""
    corpus = {r["name"]: r for r in tomllib.loads(CORPUS.read_text())["repo"]}
    for name in names:
        if name not in corpus:
            raise SystemExit(f"{name} is not in {CORPUS.name}")
        if corpus[name]["held_out"]:
            raise SystemExit(f"{name} is held out: it is measured once, at the end, by benchmarks/realrepos.py")
    return names


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def warm_image(mirror: Path, name: str, console: Console) -> None:
    """Build the repository's environment image before measuring (both configurations then find it cached)."""
    start = time.perf_counter()
    with scratch_dir("bench-env") as tmp:
        tree = Path(tmp) / "tree"
        materialize(mirror, resolve_commit(mirror, "HEAD"), tree)
        built = env_image(resolve_env(tree, name))
    console.print(f"{name}: environment image {built.image.name} ({'built' if built.built else 'cached'}, "
                  f"{time.perf_counter() - start:.0f}s)")  # fmt: skip


def run(args: argparse.Namespace, console: Console) -> list[Measured]:
    backend = BwrapBackend(base_image())
    cfg = SynthesisConfig(seed=args.seed, validate=ValidateConfig(runs=args.runs), concurrency=args.concurrency)
    synthesizer = Synthesizer(backend, cfg)
    measured = []
    try:
        with tempfile.TemporaryDirectory(prefix="tf-bench-synth-") as tmp:
            snapshots = SnapshotStore(open_store(f"file://{tmp}/store"), Path(tmp) / "cache")
            for repo in args.repos:
                mirror = args.mirrors / repo.replace("/", "+") / "repo"
                name = repo.split("/")[-1]
                warm_image(mirror, name, console)
                for config in args.configs:
                    families, pr_mirror = CONFIGS[config]
                    before = cpu_seconds()
                    tasks, funnel = synthesize_repository(mirror, snapshots, synthesizer, count=args.count,
                                                      repo_name=name, candidates=args.candidates,
                                                      families=families, pr_mirror=pr_mirror)  # fmt: skip
                    kept = sum(not host_judged_problem(t, QualityConfig()) for t in tasks)
                    measured.append(Measured(repo, config, funnel, cpu_seconds() - before, kept))
                    console.print(f"{repo} [{config}]: {measured[-1].row()}")
                    if args.metrics:  # after each row, so a run stopped for time keeps what it measured
                        write_metrics(args.metrics, measured)
    finally:
        backend.close()
    return measured


def write_metrics(path: Path, measured: list[Measured]) -> None:
    rows = [m.row() | {"funnel": m.funnel.as_dict()} for m in measured]
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps(rows, indent=2, sort_keys=True, default=str))
    partial.replace(path)


def repo_table(measured: list[Measured]) -> Table:
    table = Table(title="Synthesis per repository and configuration")
    names = ("repository", "config", "candidates per family", "broke a test", "validated", "of them PR mirror",
             "CPU s", "of it in sandboxes", "sandbox s", "wall s", "tasks / CPU-hour", "kept by the quality gate",
             "kept / CPU-hour")  # fmt: skip
    for name in names:
        table.add_column(name, justify="left" if name in names[:3] else "right")
    for m in measured:
        row = m.row()
        per_family = " ".join(f"{family}:{n}" for family, n in row["candidates"].items())
        shown = ("broke_test", "validated", "pr_mirror_validated", "cpu_s", "sandbox_cpu_s", "sandbox_s", "wall_s",
                 "tasks_per_cpu_hour", "gate_kept", "gate_kept_per_cpu_hour")  # fmt: skip
        table.add_row(row["repo"], row["config"], per_family, *(str(row[k]) for k in shown))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repos", nargs="+", default=list(DEFAULT_REPOS), help="OWNER/NAME of the tuning half")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"), help="MIRRORS/OWNER+NAME/repo")
    parser.add_argument("--count", type=int, default=20, help="validated tasks wanted per repository and config")
    parser.add_argument("--candidates", type=int, default=None, help="candidates screened at most (4 x count)")
    parser.add_argument("--runs", type=int, default=3, help="validation runs per configuration (flaky detection)")
    parser.add_argument("--concurrency", type=int, default=1, help="sandboxes at once (the machine is shared)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs", nargs="+", default=["families", "families+pr_mirror"], choices=list(CONFIGS))
    parser.add_argument("--metrics", type=Path, help="write the rows and funnels here (JSON)")
    args = parser.parse_args()
    args.repos = tuning_repos(args.repos)
    logging.basicConfig(level=logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill` unwinds like Ctrl-C: sandboxes closed
    console = Console()
    if not console.is_terminal:
        console.width = 200
    measured = run(args, console)
    console.print(repo_table(measured))
    for config in args.configs:
        merged = SynthesisFunnel.merged(m.funnel for m in measured if m.config == config)
        console.print(family_table(merged), f"({config}, all repositories)")
        cpu = sum(m.cpu_s for m in measured if m.config == config)
        rate = merged.kept / (cpu / 3600) if cpu else 0.0
        kept = sum(m.gate_kept for m in measured if m.config == config)
        console.print(f"{config}: {merged.kept} validated in {cpu:.0f} CPU-s -> {rate:.0f} tasks per CPU-hour; "
                      f"{kept} kept by the quality gate; dropped {dict(merged.dropped)}")  # fmt: skip


if __name__ == "__main__":
    main()
