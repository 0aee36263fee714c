"""Rollout throughput, and where an episode's time goes, at several concurrency levels.

    .venv/bin/python benchmarks/rollout.py [--concurrency 1,2,4,8] [--group 1] [--tasks 8]
                                           [--backend bwrap|docker] [--warm 0]

The bundled tickets are ingested and validated (one run each) into a temporary store; then the gold-patch
policy plays ``--group`` episodes per task through ``pipeline.rollout`` (``--backend`` sandboxes, every
episode verified in a fresh sandbox) at each concurrency. For each level it prints episodes/s and steps/s
over the batch's wall time, and how the episodes' summed time splits: sandbox lifecycle (the task's start
tree, acquiring the sandbox from the pool, giving it back), verification (extracting the agent's diff,
then grading it in a fresh sandbox), policy, command execution in the sandbox, and the rest: our own
overhead (the loop's bookkeeping, records, checkpoints), whose target is under 5%. The last column is the
verifier's cost in seconds per graded episode (diff extraction plus the graded run; with ``--group 1`` every
episode is graded once), then the CPU-seconds its graded runs used (the verifier sandboxes' cgroup counters:
less sensitive to the machine's load than wall time): the figures to compare before and after a verifier change.
Every gold episode must score 1.0; the benchmark fails otherwise, since a fast wrong rollout measures nothing. With
``--group`` above 1 a task's gold episodes end in the same diff, so all but the first reuse its verdict
(as a real GRPO group's duplicates do): the verification share falls and episodes/s rises accordingly.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from trialforge import pipeline
from trialforge.config import load_params
from trialforge.rollout.loop import Lineage
from trialforge.rollout.policies import GoldPolicy
from trialforge.runtime import code_version, open_runtime
from trialforge.store.records import EpisodeRecord
from trialforge.tasks.schema import task_set_version

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("sandbox_s", "verify_s", "policy_s", "exec_s")


def shares(episodes: list[EpisodeRecord]) -> list[float]:
    """Each phase's share of the episodes' summed duration; the last entry is the unaccounted rest."""
    total = sum(e.duration_s for e in episodes) or 1.0
    parts = [sum(getattr(e, phase) for e in episodes) / total for phase in PHASES]
    return [*parts, max(0.0, 1.0 - sum(parts))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels")
    parser.add_argument("--group", type=int, default=1, help="episodes per task at each level")
    parser.add_argument("--tasks", type=int, default=8, help="valid tasks to roll out (0: all)")
    parser.add_argument("--backend", choices=("bwrap", "docker"), default="bwrap")
    parser.add_argument("--warm", type=int, default=0, help="idle sandboxes kept for reuse (sandbox.warm)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    with tempfile.TemporaryDirectory(prefix="tf-bench-rollout-") as tmp:
        overrides = {
            "run.store": f"file://{tmp}/store",
            "run.out_dir": f"{tmp}/out",
            "sources.tickets": str(ROOT / "tasks_src" / "tickets" / "github_issues.jsonl"),
            "sources.repos": str(ROOT / "tasks_src" / "repos"),
            "validate.runs": 1,
            "rollout.group_size": args.group,
            "sandbox.backend": args.backend,
            "sandbox.warm": args.warm,
        }
        params = load_params(None, overrides)
        with open_runtime(params) as rt:
            start = time.monotonic()
            tasks, _ = pipeline.ingest(rt)
            checked, _ = pipeline.validate(rt, tasks)
            valid = checked[: args.tasks] if args.tasks else checked
            print(f"{len(tasks)} tasks ingested, {len(checked)} valid, in {time.monotonic() - start:.0f}s; rolling out "
                  f"{len(valid)} with the gold policy, {args.group} episode(s) each, on {rt.backend.name}")  # fmt: skip
            lineage = Lineage("bench-rollout", 0, task_set_version(valid), params.digest(), code_version())
            gold = GoldPolicy(valid)
            header = f"{'conc':>4} {'episodes':>8} {'wall s':>7} {'ep/s':>6} {'steps/s':>7}"
            names = ("sandbox", "verify", "policy", "exec", "other")
            print(header + "".join(f"{name:>9}" for name in names) + f"{'verify s/ep':>12}{'verify cpu/ep':>14}")
            for level in levels:
                rt.params = load_params(None, {**overrides, "sandbox.concurrency": level})
                t0 = time.monotonic()
                episodes = pipeline.rollout(rt, valid, [gold], lineage)
                wall = time.monotonic() - t0
                wrong = [(e.task_id, e.status, e.reward) for e in episodes if (e.status, e.reward) != ("ok", 1.0)]
                if wrong:
                    raise SystemExit(f"gold episodes that did not score 1.0 at concurrency {level}: {wrong}")
                steps = sum(e.steps for e in episodes)
                row = f"{level:>4} {len(episodes):>8} {wall:>7.1f} {len(episodes) / wall:>6.2f} {steps / wall:>7.2f}"
                verify_per_episode = sum(e.verify_s for e in episodes) / len(episodes)
                cpu = [e.verify_cpu_s for e in episodes if e.verify_cpu_s is not None]
                cpu_per_episode = f"{sum(cpu) / len(cpu):>14.3f}" if cpu else f"{'-':>14}"
                print(row + "".join(f"{share:>9.1%}" for share in shares(episodes)) + f"{verify_per_episode:>12.3f}"
                      + cpu_per_episode)  # fmt: skip


if __name__ == "__main__":
    main()
