"""What surviving a sandbox failure costs per backend, and the episode time it saves over starting again.

    .venv/bin/python benchmarks/recovery.py [--backends bwrap,docker] [--steps 20] [--fail-at 17] [--policy-s 0.25]

One bundled task is ingested and validated; a scripted policy plays ``--steps`` actions around the task's
real fix (commands, notes written and viewed, the fix's edits, a final ``rm``), waiting ``--policy-s`` before
each as a stand-in for a model's latency. Per backend it prints:

* checkpoint: one checkpoint of the episode's workspace (export, pack), kept in memory and put into a
  ``file://`` store;
* restore: a new sandbox started from a checkpoint;
* four runs of the episode (wall time): uninterrupted with periodic checkpoints and without them (the
  checkpoints' overhead), and with its sandbox killed before action ``--fail-at``: recovered (restore and
  replay, whose own cost is printed from the episode's record) versus restarted from scratch (no recovery,
  one retry), and what recovery saved.

Every run must end with reward 1.0: a fast wrong recovery measures nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trialforge.rollout.checkpoints import Checkpoints
from trialforge.rollout.env import Action, EnvLimits
from trialforge.rollout.loop import Lineage, Rollout
from trialforge.rollout.policies import Decision, EpisodePolicy, TaskView, patch_to_actions
from trialforge.rollout.settings import RecoveryConfig
from trialforge.sandbox.base import Backend, Limits, Sandbox, SandboxSpec
from trialforge.sandbox.bwrap.backend import BwrapBackend
from trialforge.sandbox.images import base_image
from trialforge.store.objstore import ObjectStore, open_store
from trialforge.store.records import EpisodeRecord
from trialforge.tasks.ingest.github import ingest_github_issues
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader

ROOT = Path(__file__).resolve().parents[1]
TASK_ID = "ledgerlite-3"


class Tracking:
    """A backend that remembers the sandboxes it made, so the benchmark can kill the live one."""

    def __init__(self, inner: Backend) -> None:
        self.inner, self.name = inner, inner.name
        self.image_for = inner.image_for
        self.made: list[Sandbox] = []

    def create(self, spec: SandboxSpec) -> Sandbox:
        sandbox = self.inner.create(spec)
        self.made.append(sandbox)
        return sandbox


class Busy:
    """``steps`` actions around a task's fix, ``latency`` seconds of "thinking" each; ``kill`` runs once, at ``at``."""

    name, version = "busy", "bench"

    def __init__(self, task: Task, steps: int, latency: float, kill: Callable[[], None] | None, at: int) -> None:
        self.fix = patch_to_actions(task.gold_patch)
        self.steps, self.latency, self.kill, self.at = steps, latency, kill, at

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        path = self.fix[0].args["path"]
        chores = [
            Action(tool="run", args={"command": "python3 -c 'import json; print(json.dumps(list(range(9))))'"}),
            Action(tool="view", args={"path": path, "start": 1, "end": 30}),
            Action(tool="create", args={"path": "notes/n.txt", "content": "x\n"}),
            Action(tool="run", args={"command": "cat notes/n.txt >> notes/log.txt && wc -l notes/log.txt"}),
        ]
        body = [chores[i % len(chores)] for i in range(self.steps - len(self.fix) - 1)]
        middle = len(body) // 2
        cleanup = Action(tool="run", args={"command": "rm -r notes"})
        return _Acting([*body[:middle], *self.fix, *body[middle:], cleanup], self)


class _Acting:
    def __init__(self, actions: list[Action], policy: Busy) -> None:
        self.actions, self.policy, self.acts = actions, policy, 0

    def act(self, observation: str) -> Decision:
        time.sleep(self.policy.latency)
        kill = self.policy.kill
        if kill is not None and self.acts == self.policy.at:
            self.policy.kill = None  # once: a restarted episode must be able to finish
            kill()
        self.acts += 1
        return Decision(self.actions.pop(0) if self.actions else Action(tool="submit"))


@contextlib.contextmanager
def backends(names: list[str]) -> Iterator[list[Backend]]:
    image = base_image()
    with contextlib.ExitStack() as stack:
        found: list[Backend] = []
        if "bwrap" in names:
            bwrap = BwrapBackend(image)
            stack.callback(bwrap.close)
            found.append(bwrap)
        if "docker" in names:
            from trialforge.sandbox.container.backend import DockerBackend
            from trialforge.sandbox.container.engine import PodmanService, engine_client

            service = stack.enter_context(PodmanService())
            docker = DockerBackend(engine_client(service.base_url), image)
            stack.callback(docker.close)
            found.append(docker)
        yield found


@dataclass
class Bench:
    task: Task
    snapshots: SnapshotStore
    store: ObjectStore
    grader: Grader
    args: argparse.Namespace

    def rollout(self, backend: Backend, **recovery: Any) -> Rollout:
        image = base_image()
        return Rollout(
            backend=backend,
            image=image.name,
            image_digest=image.digest,
            snapshots=self.snapshots,
            grader=self.grader,
            limits=Limits(),
            env_limits=EnvLimits(max_turns=self.args.steps + 5),
            lineage=Lineage("bench-recovery", 0, "tasks", "params", "code"),
            recovery=RecoveryConfig(**{"checkpoint_every": self.args.checkpoint_every, **recovery}),
            store=self.store,
        )

    def episode(self, rollout: Rollout, kill: Callable[[], None] | None = None) -> tuple[float, EpisodeRecord]:
        """Wall time of one episode (retries included) and its record; it must earn reward 1."""
        policy = Busy(self.task, self.args.steps, self.args.policy_s, kill, self.args.fail_at)
        start = time.monotonic()
        record = rollout.episode(self.task, policy, 0, 1)
        wall = time.monotonic() - start
        if record.reward != 1.0:
            raise SystemExit(
                f"{rollout.backend.name}: the episode ended {record.status} ({record.cause}), not reward 1"
            )
        return wall, record

    def checkpoint_costs(self, backend: Backend, record: EpisodeRecord, tmp: Path) -> dict[str, float]:
        """Median ms of a checkpoint (the task's repository, ``record``'s steps) and of a restore from it."""
        base = self.snapshots.materialize(self.task.snapshot)
        spec = SandboxSpec(image=base_image().name, workspace=base, limits=Limits())
        memory = Checkpoints(base, None, "bench/", keep_all=False)
        durable = Checkpoints(base, open_store(f"file://{tmp / 'checkpoints'}"), "bench/", keep_all=False)
        sandbox = backend.create(spec)
        try:
            return {
                "checkpoint, in memory": median_ms(
                    lambda: memory.take(sandbox.export_workspace, record, 0.0), self.args.reps
                ),
                "checkpoint, in a file:// store": median_ms(
                    lambda: durable.take(sandbox.export_workspace, record, 0.0), self.args.reps
                ),
                "restore (a new sandbox)": median_ms(
                    lambda: durable.open(backend, spec, durable.latest).close(), self.args.reps
                ),
            }
        finally:
            sandbox.close()


def median_ms(fn: Callable[[], Any], reps: int) -> float:
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def report(bench: Bench, backend: Backend, tmp: Path) -> None:
    tracking = Tracking(backend)
    kill = lambda: tracking.made[-1].close()  # noqa: E731
    bench.episode(bench.rollout(tracking))  # warms the verdict cache: every run below grades the same diff
    plain, record = bench.episode(bench.rollout(tracking))
    bare, _ = bench.episode(bench.rollout(tracking, checkpoint_every=0))
    recovered, hurt = bench.episode(bench.rollout(tracking), kill)
    restarted, _ = bench.episode(bench.rollout(tracking, max_recoveries=0, env_retries=1), kill)
    (event,) = json.loads(hurt.recoveries)
    print(f"\n== {backend.name}")
    for name, ms in bench.checkpoint_costs(backend, record, tmp).items():
        print(f"  {name:<36} {ms:8.1f} ms")
    what = f"recovery (restore + replay {event['replayed']})"
    print(f"  {what:<36} {event['seconds'] * 1000:8.1f} ms   from step-{event['checkpoint']}")
    print(f"  {'episode, uninterrupted':<36} {plain:8.2f} s    {bare:.2f} s without periodic checkpoints")
    print(f"  {'episode, killed, recovered':<36} {recovered:8.2f} s")
    print(f"  {'episode, killed, restarted':<36} {restarted:8.2f} s")
    print(
        f"  {'saved by recovery':<36} {restarted - recovered:8.2f} s    restart/recovery {restarted / recovered:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="bwrap,docker")
    parser.add_argument("--steps", type=int, default=20, help="actions per episode")
    parser.add_argument("--fail-at", type=int, default=17, help="the sandbox is killed before this action")
    parser.add_argument("--policy-s", type=float, default=0.25, help="seconds the policy takes per action")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5, help="repetitions of the checkpoint and restore timings")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tf-bench-recovery-") as name, backends(args.backends.split(",")) as found:
        tmp = Path(name)
        store = open_store(f"file://{tmp / 'store'}")
        snapshots = SnapshotStore(store, tmp / "cache")
        src = ROOT / "tasks_src"
        tasks, _ = ingest_github_issues(src / "tickets" / "github_issues.jsonl", src / "repos", snapshots)
        (task,) = [t for t in tasks if t.task_id == TASK_ID]
        image = base_image()
        task = validate_task(task, found[0], image.name, snapshots, Limits(), ValidateConfig(runs=1))
        grader = Grader(found[0], image.name, image.digest, snapshots, Limits())
        print(
            f"task {task.task_id}: {args.steps} actions, {args.policy_s} s of policy each, sandbox killed before "
            f"action {args.fail_at}, a checkpoint every {args.checkpoint_every} steps that changed the workspace"
        )
        bench = Bench(task, snapshots, store, grader, args)
        for backend in found:
            report(bench, backend, tmp)


if __name__ == "__main__":
    main()
