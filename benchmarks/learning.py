"""Does the embedded demo learn? Rollout -> GRPO update for several iterations on CPU, pass rate per iteration.

    .venv/bin/python benchmarks/learning.py [--iterations 6] [--tasks 12] [--group 8] [--seed 0] [--lr 0.8] [--epochs 1]

Tasks are synthesized from the bundled repositories by bug injection (validated in
sandboxes), so their failing tests are visible to the policy. Only the mutation
families a single-token repair can undo are injected (a deleted statement or branch
is beyond the demo policy's edits, and such tasks would only dilute the signal).
The policy starts uniform over its candidate edits (weights 0), tries up to 3 of
them per episode, and is updated by the GRPO loss after each batch: one on-policy
step (so the ratio is 1 and clipping is inactive) with a large step size, over groups
of 8 so that even a task solved one time in eight carries a signal. The printed pass
rate is that of each batch, measured before its own update, under the policy version
that produced it.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from trialforge import pipeline
from trialforge.config import load_params
from trialforge.rollout.loop import Lineage
from trialforge.rollout.repair import FEATURES
from trialforge.runtime import code_version, open_runtime
from trialforge.tasks.schema import task_set_version
from trialforge.tasks.synthesize import SynthesisConfig, synthesize
from trialforge.tasks.validate import ValidateConfig
from trialforge.train.repair_trainer import RepairTrainer

REPOS = Path(__file__).resolve().parents[1] / "tasks_src" / "repos"
# Bugs one token can undo: what the repair policy's candidate edits can invert.
REPAIRABLE = ("flip_compare", "flip_boolean", "flip_arith", "off_by_one", "change_constant", "swap_args",
              "invert_condition", "wrong_callee")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.8)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tf-learning-") as tmp:
        params = load_params(
            None,
            {
                "run.store": f"file://{tmp}/store",
                "run.out_dir": f"{tmp}/out",
                "run.seed": args.seed,
                "rollout.policies": ["repair"],
                "rollout.group_size": args.group,
                "rollout.max_turns": 16,
                "train.lr": args.lr,
                "train.epochs": args.epochs,
            },
        )
        with open_runtime(params) as rt:
            start = time.monotonic()
            tasks = []
            cfg = SynthesisConfig(
                max_total=max(args.tasks // 3 * 2, 4),  # per repository; the shuffle below picks from all three
                seed=args.seed,
                families=REPAIRABLE,
                validate=ValidateConfig(runs=1),
                concurrency=2,
            )
            for repo in sorted(p for p in REPOS.iterdir() if p.is_dir()):
                made, _ = synthesize(repo, repo.name, rt.backend, rt.image.name, rt.snapshots, cfg)
                tasks += made
            random.Random(args.seed).shuffle(tasks)
            tasks = tasks[: args.tasks]
            print(f"{len(tasks)} synthesized tasks in {time.monotonic() - start:.0f}s; seed {args.seed}")
            trainer = RepairTrainer(params.train)
            version = task_set_version(tasks)
            print(f"{'iter':>4} {'policy':>7} {'pass rate':>9} {'zero-var groups':>15} {'loss':>8} {'seconds':>8}")
            rates = []
            for iteration in range(args.iterations):
                t0 = time.monotonic()
                lineage = Lineage("learning", iteration, version, params.digest(), code_version())
                episodes = pipeline.rollout(rt, tasks, [trainer.policy()], lineage)
                ok = [e for e in episodes if e.status == "ok"]
                rate = sum(e.reward for e in ok) / max(len(ok), 1)
                rates.append(rate)
                produced_by = trainer.policy().version
                update = trainer.update(episodes)
                print(
                    f"{iteration:>4} {produced_by:>7} {rate:>9.3f} {update.zero_variance_groups:>15} "
                    f"{update.loss:>8.4f} {time.monotonic() - t0:>8.1f}",
                    flush=True,
                )
            print(f"first iteration pass rate {rates[0]:.3f}, last {rates[-1]:.3f}, "
                  f"mean of last two {sum(rates[-2:]) / 2:.3f}")  # fmt: skip
            weights = trainer.weights.detach().tolist()
            print("learned weights: " + ", ".join(f"{n}={w:+.2f}" for n, w in zip(FEATURES, weights, strict=True)))


if __name__ == "__main__":
    main()
