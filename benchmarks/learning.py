"""Does the learner learn, on tasks it never trained on? Train and held-out pass rates per iteration over
several seeds, against baselines measured in the same run.

    .venv/bin/python benchmarks/learning.py [--seeds 3] [--iterations N] [--workdir DIR] [-p params.yaml]
                                            [-S key=value ...]

The task set is the demo's (``params.yaml``: the bundled tickets plus bug-injection tasks of every mutation
family, validated, decontaminated and quality-gated; ``curate.eval_fraction`` of each family held out).
It is built once. Each seed then trains the repair policy from zero weights through the loop ``trialforge run``
uses (sampler, health gate, GRPO step), scoring it on the held-out tasks every iteration and after the last
update (the same seeds each time). Baselines, on the same tasks in the same run:

- *untrained*: the policy at version 0 (zero weights: uniform over its candidate edits), per seed;
- *random edits*: ``random_edit``, single-token edits drawn uniformly from every line of the library files
  (no localisation), checked against the failing tests like the learner's.

And a ceiling: the policy's own features fitted by supervised learning to the gold edits of the train tasks
the learner drew (the candidates each episode built, replayed from its recorded observations; L2-regularised
log-likelihood of the gold edit), scored on the held-out tasks as the expected share solved within the
policy's attempts. A learner near it is limited by what its features can tell apart, not by its training.

Per family: whether the fixes lie in the policy's action space at all (``rollout.reach``), and the learner's
held-out and train pass rates at the first and last evaluation. Pass rate: episodes solved over ok episodes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import yaml

from trialforge import pipeline
from trialforge.config import load_params
from trialforge.loop.iteration import train_in_process
from trialforge.loop.records import load_episodes
from trialforge.rollout.loop import Lineage, run_batch
from trialforge.rollout.policies import TaskView
from trialforge.rollout.reach import family_reach, gold_edit
from trialforge.rollout.repair import RandomEditPolicy, RepairPolicy, candidates_seen
from trialforge.rollout.repair_edits import N_FEATURES
from trialforge.runtime import code_version, open_runtime
from trialforge.store import datasets
from trialforge.tasks.schema import Task, task_set_version
from trialforge.tasks.taskset import read_tasks, write_tasks

RANDOM_GROUP = 2  # random-edit episodes per task and seed: it never learns, two per seed bound its rate well
CEILING_DRAWS = 400  # sampled episodes per held-out task when scoring the fitted weights


def curated(params) -> list[Task]:
    """The demo's task set, through the pipeline's own steps."""
    with open_runtime(params) as rt:
        tasks, _ = pipeline.ingest(rt)
        for step in (pipeline.validate, pipeline.decontaminate, pipeline.quality):
            tasks, _ = step(rt, tasks)
        return pipeline.tier(tasks)


def solved(frame: pd.DataFrame) -> float | None:
    ok = frame[frame["status"] == "ok"]
    return float((ok["reward"] >= 1.0).mean()) if len(ok) else None


def curves(episodes: pd.DataFrame) -> dict[str, list[float | None]]:
    """The learner's pass rate per iteration on train and on held-out tasks."""
    last = int(episodes["iteration"].max())
    out: dict[str, list[float | None]] = {}
    for split in ("train", "eval"):
        mine = episodes[episodes["split"] == split]
        out[split] = [solved(mine[mine["iteration"] == i]) for i in range(last + 1)]
    return out


def mean_sd(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    spread = statistics.stdev(known) if len(known) > 1 else 0.0
    return f"{statistics.fmean(known):.3f} ± {spread:.3f}"


@dataclass
class Seed:
    """One seed's figures: the learner's curves, the random-edit baseline, per family first and last rates."""

    curves: dict[str, list[float | None]]
    random_edits: dict[str, float | None]
    families: dict[str, dict[str, float | None]]
    ceiling: float


@dataclass(frozen=True)
class Choice:
    """One task's candidate edits as the policy built them, which one is the gold fix, and the attempts allowed."""

    features: torch.Tensor  # [candidates, features]
    gold: int | None
    attempts: int


def choices(rt, run_id: str, tasks: list[Task]) -> dict[str, Choice]:
    """Per task the learner rolled out in ``run_id``: its candidates, replayed from the first episode's steps."""
    by_id, found = {t.task_id: t for t in tasks}, {}
    for iteration in range(rt.params.train.iterations + 1):
        for episode in load_episodes(rt.store, run_id, iteration, RepairPolicy.name):
            task = by_id[episode.task_id]
            if task.task_id not in found and episode.status == "ok":
                view = TaskView(task.task_id, task.problem_statement)
                candidates, attempts = candidates_seen(view, [s.observation for s in episode.step_rows])
                features = torch.tensor([c.features for c in candidates] or [[0.0] * N_FEATURES], dtype=torch.float64)
                found[task.task_id] = Choice(features, gold_edit(task, candidates), attempts if candidates else 0)
    return found


def ceiling(seen: dict[str, Choice], tasks: list[Task], seed: int) -> float:
    """Fit the policy's weights to the drawn train tasks' gold edits; the held-out tasks' expected pass rate."""
    train = [c for t in tasks if t.split == "train" and (c := seen.get(t.task_id)) and c.gold is not None]
    weights = torch.zeros(N_FEATURES, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([weights], lr=0.05)
    for _ in range(800):
        nll = sum(-torch.log_softmax(c.features @ weights, 0)[c.gold] for c in train) / max(len(train), 1)
        loss = nll + 0.01 * (weights**2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    rng = torch.Generator().manual_seed(seed)
    held_out = [seen.get(t.task_id) for t in tasks if t.split == "eval"]
    rates = [solved_within(c, weights.detach(), rng) if c is not None else 0.0 for c in held_out]
    return sum(rates) / len(rates)


def solved_within(choice: Choice, weights: torch.Tensor, rng: torch.Generator) -> float:
    """Share of sampled episodes whose attempts (drawn without replacement, as the policy draws) hit the gold edit."""
    if choice.gold is None:
        return 0.0
    probs = torch.softmax(choice.features @ weights, 0)
    k = min(choice.attempts, len(probs))
    tries = torch.stack([torch.multinomial(probs, k, replacement=False, generator=rng) for _ in range(CEILING_DRAWS)])
    return float((tries == choice.gold).any(dim=1).double().mean())


def run_seed(args: argparse.Namespace, overrides: dict, tasks: list[Task], seed: int) -> Seed:
    params = load_params(args.params, overrides | {"run.seed": seed, "rollout.policies": ["repair"]})
    with open_runtime(params) as rt:
        train_in_process(rt, tasks, f"learn-s{seed}")
        episodes = datasets.read_pandas(rt.store, "episodes", filters={"run": f"learn-s{seed}"})
        lineage = Lineage(f"random-s{seed}", 0, task_set_version(tasks), params.digest(), code_version())
        runner = pipeline.make_rollout(rt, lineage)
        baseline = run_batch(runner, tasks, [RandomEditPolicy()], RANDOM_GROUP, seed, params.sandbox.concurrency)
        fitted = ceiling(choices(rt, f"learn-s{seed}", tasks), tasks, seed)
    episodes["iteration"] = episodes["iteration"].astype(int)
    random_edits = {}
    for split in ("train", "eval"):
        ok = [e for e in baseline if e.split == split and e.status == "ok"]
        random_edits[split] = sum(e.reward >= 1.0 for e in ok) / len(ok) if ok else None
    families: dict[str, dict[str, float | None]] = defaultdict(dict)
    by_family = episodes.assign(family=episodes["task_id"].map({t.task_id: t.family() for t in tasks}))
    for family, rows in by_family.groupby("family"):
        for split in ("train", "eval"):
            mine = rows[rows["split"] == split]
            if len(mine):  # train: the batches drawn; eval: every task, every iteration
                first, last = mine["iteration"].min(), mine["iteration"].max()
                families[family][f"{split}_first"] = solved(mine[mine["iteration"] == first])
                families[family][f"{split}_last"] = solved(mine[mine["iteration"] == last])
    return Seed(curves(episodes), random_edits, families, fitted)


def report(seeds: list[Seed], tasks: list[Task]) -> None:
    iterations = max(len(s.curves["eval"]) for s in seeds)
    print(f"\npass rate over {len(seeds)} seeds (mean ± sd); iteration {iterations - 1} is the final checkpoint")
    print(f"{'iteration':>9}  {'train':>15}  {'held-out':>15}")
    for i in range(iterations):
        cells = [
            [s.curves[split][i] if i < len(s.curves[split]) else None for s in seeds] for split in ("train", "eval")
        ]
        print(f"{i:>9}  {mean_sd(cells[0]):>15}  {mean_sd(cells[1]):>15}")
    untrained, final = [s.curves["eval"][0] for s in seeds], [s.curves["eval"][-1] for s in seeds]
    first_train = mean_sd([s.curves["train"][0] for s in seeds])
    print(f"baseline untrained (v0): held-out {mean_sd(untrained)}, train {first_train}")
    randoms = {split: mean_sd([s.random_edits[split] for s in seeds]) for split in ("eval", "train")}
    print(f"baseline random edits:   held-out {randoms['eval']}, train {randoms['train']}")
    fitted = mean_sd([s.ceiling for s in seeds])
    print(f"ceiling, the policy's features fitted to the drawn train tasks' gold edits: held-out {fitted}")
    pairs = ", ".join(f"{u:.3f} -> {f:.3f}" for u, f in zip(untrained, final, strict=True) if None not in (u, f))
    print(f"held-out per seed, untrained -> trained: {pairs}")

    print(f"\n{'family':>18} {'tasks':>5} {'in reach':>8}  {'held-out first -> last':>31}  {'train first -> last':>31}")
    reach = family_reach(tasks)
    for family in sorted(reach):
        cells = []
        for split in ("eval", "train"):
            first = [s.families.get(family, {}).get(f"{split}_first") for s in seeds]
            last = [s.families.get(family, {}).get(f"{split}_last") for s in seeds]
            cells.append(f"{mean_sd(first)} -> {mean_sd(last)}" if any(v is not None for v in first) else "-")
        row = reach[family]
        print(f"{family:>18} {row['tasks']:>5} {row['reachable']:>8}  {cells[0]:>31}  {cells[1]:>31}")
    print("\nout of reach (the repair policy changes one token of one line, or puts back an unread name):")
    for family in sorted(reach):
        for reason, count in reach[family]["unreachable_reasons"].items():
            print(f"  {family}: {count} x {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=None, help="default: train.iterations of the params")
    parser.add_argument("-p", "--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("-S", "--set", action="append", default=[], help="override one parameter: key=value")
    parser.add_argument(
        "--workdir", type=Path, default=None,
        help="keep the store and the curated task set here; a later run with the same DIR skips curation "
        "(compare training settings on one task set); default: a temporary directory",
    )  # fmt: skip
    args = parser.parse_args()
    # A run given --workdir makes no scratch directory: none is left behind if it is killed.
    scratch = tempfile.TemporaryDirectory(prefix="tf-learning-") if args.workdir is None else nullcontext(args.workdir)
    with scratch as tmp:
        root = Path(tmp).resolve()
        overrides: dict = {"run.store": f"file://{root}/store", "run.out_dir": f"{root}/out"}
        overrides |= {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.set)}
        if args.iterations:
            overrides["train.iterations"] = args.iterations
        start = time.monotonic()
        cached = root / "tasks.parquet"
        if cached.exists():
            tasks = read_tasks(cached)
        else:
            tasks = curated(load_params(args.params, overrides))
            write_tasks(cached, tasks)
        held_out = [t for t in tasks if t.split == "eval"]
        print(f"{len(tasks)} tasks ({len(held_out)} held out) in {time.monotonic() - start:.0f}s")
        if not held_out:
            raise SystemExit("no held-out tasks: set curate.eval_fraction above 0")
        seeds = []
        for seed in range(args.seeds):
            t0 = time.monotonic()
            seeds.append(run_seed(args, overrides, tasks, seed))
            print(f"seed {seed}: {time.monotonic() - t0:.0f}s", flush=True)
        report(seeds, tasks)


if __name__ == "__main__":
    main()
