"""Thousands of concurrent episodes through the real scheduler, pool, agent loop, grader and store writer, on
simulated sandboxes whose latencies are measured on real bubblewrap in the same run: controller CPU and memory
per episode as concurrency grows, where one controller process stops scaling and why, and a sizing table.

    .venv/bin/python benchmarks/scale_sim.py [--levels 100@5,500@10,500@40] [--episode-s 120]
                                             [--engine-batch 64] [--targets 10,100,1000] [--stored] [--seed 0]
    .venv/bin/python benchmarks/scale_sim.py --levels 100@5,1000@10,3000@10,10000@20x4   # 10,000 in flight

1. Measure (real): the bundled tickets are ingested, ``--tasks`` of them validated in real bubblewrap sandboxes,
   and ``--measure-episodes`` episodes of the agent below run through ``run_jobs`` on bubblewrap and are graded
   (each must score 1.0: a workload that fails on real sandboxes measures nothing). A ``Recorder`` times every
   create, reset, command, test run and close; one lognormal per operation is fitted and printed.
   ``--stored`` draws from ``simulated_sandbox.BWRAP_2CORE`` instead (a fit stored from an earlier run).
2. Simulate: a level ``N@R`` runs N episodes at once (``run_jobs`` at concurrency N, each in its own thread) in
   a fresh process (its peak memory is its own), their thinking stretched so that N in flight offer R episodes/s
   (Little's law: an episode lasts N/R seconds), then writes them with the real store writer
   (``pipeline.store_episodes``: Parquet, file store). Real: the scheduler, the elastic ``SandboxPool``, the agent
   loop (its tools on the in-memory workspace, a checkpoint, the final diff by git), the grader's host side (a
   copy of the pristine tree, ``git apply`` of the diff and of the test patch, canaries planted, files hashed)
   and the store writer. Drawn: every sandbox operation (``SimulatedBackend``), the graded test run included (it
   brings back no report, so simulated episodes score 0), and the policy's thinking (lognormal per turn, sigma
   0.5; an episode's total from 0.5 to 1.5 times the mean): an assumption standing in for an inference engine,
   which this machine does not have.
   The agent: grep the repository, view the file to fix, make the gold patch's edits, leave a note of its own
   (so every episode's diff differs and every episode is graded, as an RL policy's are), run the tests, submit.
   ``N@RxK`` spreads the N episodes over K such processes at once, N/K each (each its own scheduler, pool and
   store writer, as Ray shards are): their cores and memory add, per-episode figures are their mean.
   A level sustains its rate when N / (its mean episode time) reaches 80% of R; one that does not shows where
   one process stops scaling, with its CPU: the interpreter's (one Python thread runs at a time) and git's. A
   level still running after ``--level-timeout`` is cut off and reported with what its threads are doing.
   Every episode's scratch copies (a checkpoint, the final diff, the grading tree) and the store go to
   ``--scratch``: tmpfs (/dev/shm) by default, as a controller should run; on a disk filesystem (ext4 here) the
   kernel's share of each episode's CPU grows, and varies with how many files were deleted there lately.
3. Size: Little's law on the measured per-episode figures, for episodes of ``--episode-s`` (assumed): episodes
   in flight, sandboxes, inference engines (episodes thinking at once / ``--engine-batch``, assumed: the episodes
   one engine serves at the turn latency) and controller processes (at the highest rate a level sustained).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from simulated_sandbox import BWRAP_2CORE, LatencyModel, Lognormal, Recorder, SimulatedBackend

from trialforge import pipeline
from trialforge.rollout.env import Action, EnvLimits
from trialforge.rollout.loop import Lineage, Rollout, plan_jobs, run_jobs
from trialforge.rollout.policies import Decision, EpisodePolicy, TaskView, patch_to_actions
from trialforge.sandbox.base import Backend, Limits
from trialforge.sandbox.host.statedir import private_dir
from trialforge.sandbox.images import base_image
from trialforge.sandbox.pool import ElasticConfig, PoolConfig, SandboxPool
from trialforge.store.objstore import open_store
from trialforge.store.records import EpisodeRecord
from trialforge.tasks.ingest.github import ingest_github_issues
from trialforge.tasks.patches import touched_paths
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader

ROOT = Path(__file__).resolve().parents[1]
LIMITS = Limits()
TURN_SIGMA = 0.5  # spread of the assumed per-turn policy latency (lognormal)
SUSTAINED = 0.8  # a level sustains its rate when its episodes' throughput reaches this share of it
BASELINE = 8  # episodes run one at a time, without thinking: the uncontended episode
BASELINE_TIMEOUT_S = 600.0
SHM = "/dev/shm"  # tmpfs: scratch files cost the kernel far less (and far more steadily) than on a disk filesystem


# --- the workload --------------------------------------------------------------------------------------------
class SimAgent:
    """A scripted agent that looks around, fixes the task, tests and submits, thinking ``think_s`` in all on
    average. Episodes differ in length (from half to one and a half times the mean, uniformly, as episodes of
    different lengths do), so a batch's episodes end at the rate it offers, not all at once."""

    name = "sim-agent"
    version = "scripted"

    def __init__(self, tasks: list[Task], think_s: float) -> None:
        self.patches = {t.task_id: t.gold_patch for t in tasks}
        self.think_s = think_s

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        patch = self.patches[view.task_id]
        actions = [
            Action(tool="run", args={"command": "grep -rn 'def ' --include=*.py . | head -40"}),
            Action(tool="view", args={"path": touched_paths(patch)[0]}),
            *patch_to_actions(patch),
            Action(tool="create", args={"path": f"notes/episode-{seed}.md", "content": f"episode {seed}: fixed\n"}),
            Action(tool="run", args={"command": "python3 -m pytest -q -x"}),
            Action(tool="submit"),
        ]
        rng = random.Random(seed)
        per_turn = self.think_s * rng.uniform(0.5, 1.5) / len(actions)  # a lognormal's mean: median x e^(sigma^2/2)
        turn = Lognormal(math.log(per_turn) - TURN_SIGMA**2 / 2, TURN_SIGMA, 0) if per_turn > 0 else None
        return _Thinking(actions, turn, rng)


class _Thinking:
    def __init__(self, actions: list[Action], turn: Lognormal | None, rng: random.Random) -> None:
        self.actions, self.turn, self.rng = actions, turn, rng

    def act(self, observation: str) -> Decision:
        if self.turn is not None:
            time.sleep(self.turn.draw(self.rng))
        return Decision(self.actions.pop(0))


def rollout_for(backend: Backend, pool: SandboxPool, snapshots: SnapshotStore, lineage: Lineage) -> Rollout:
    image = backend.image_for("")
    return Rollout(
        backend=backend,
        image=image.name,
        image_digest=image.digest,
        snapshots=snapshots,
        grader=Grader(backend, image.name, image.digest, snapshots, LIMITS),
        # contention slows episodes: never cut short
        limits=LIMITS.model_copy(update={"episode_timeout_s": 7200}),
        env_limits=EnvLimits(max_turns=20),
        lineage=lineage,
        pool=pool,
    )


# --- 1. measure ----------------------------------------------------------------------------------------------
def measure(state: Path, n_tasks: int, episodes: int, seed: int) -> tuple[list[Task], LatencyModel]:
    """Validated tasks, and the latencies of real bubblewrap sandboxes doing this benchmark's work."""
    from trialforge.sandbox.bwrap.backend import BwrapBackend

    image = base_image()
    bwrap = BwrapBackend(image)
    recorder = Recorder(bwrap)
    snapshots = SnapshotStore(open_store(f"file://{state / 'store'}"), state / "cache")
    src = ROOT / "tasks_src"
    ingested, _ = ingest_github_issues(src / "tickets" / "github_issues.jsonl", src / "repos", snapshots)
    tasks: list[Task] = []
    pool = SandboxPool(recorder, LIMITS, PoolConfig(max_sandboxes=4, warm_per_image=2))  # warm: resets measured
    try:
        for task in ingested:
            if len(tasks) < n_tasks:
                checked = validate_task(task, recorder, image.name, snapshots, LIMITS, ValidateConfig(runs=1))
                tasks += [checked] if checked.validation.valid else []
        rollout = rollout_for(recorder, pool, snapshots, Lineage("bench-scale-measure", 0, "-", "-", "-"))
        jobs = plan_jobs(tasks, [SimAgent(tasks, 0.0)], math.ceil(episodes / len(tasks)), seed)[:episodes]
        done = run_jobs(rollout, jobs, concurrency=2)
    finally:
        pool.close()
        bwrap.close()
    wrong = [(e.task_id, e.status, e.reward, e.cause) for e in done if e.reward != 1.0]
    if wrong:
        raise SystemExit(f"the agent's episodes must score 1.0 on real sandboxes; these did not: {wrong}")
    return tasks, recorder.model(f"measured now: real bwrap, {len(tasks)} tasks validated, {len(done)} episodes graded")


# --- 2. one level, in its own process --------------------------------------------------------------------------
def filesystem(path: Path) -> str:
    """The type of the filesystem holding ``path``."""
    mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    return max((m for m in mounts if str(path.resolve()).startswith(m[0])), key=lambda m: len(m[0]))[1]


def cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def sys_s() -> float:
    """The process's CPU time in the kernel (its file operations, and its threads' handoffs of the GIL)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_level(state: Path, n: int, think_s: float, concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    tasks = [Task.model_validate(t) for t in json.loads((state / "tasks.json").read_text())]
    model = LatencyModel.from_dict(json.loads((state / "model.json").read_text()))
    store = open_store(f"file://{state / 'store'}")
    snapshots = SnapshotStore(store, state / "cache")
    seed = args.seed + 1000 * args.shard  # the processes of one level draw different episodes
    backend = SimulatedBackend(model, seed=seed)
    elastic = ElasticConfig(enabled=True, max_warm=args.max_starting)
    pool = SandboxPool(backend, LIMITS, PoolConfig(max_sandboxes=n, max_starting=args.max_starting, elastic=elastic))
    lineage = Lineage(f"bench-scale-{args.shard}", n, "-", "-", "-")  # each process of a level its own run
    jobs = plan_jobs(tasks, [SimAgent(tasks, think_s)], math.ceil(n / len(tasks)), seed)[:n]
    for task in tasks:
        snapshots.materialize(task.snapshot)  # unpacked before the clock starts, as a warm worker has them
    rollout = rollout_for(backend, pool, snapshots, lineage)
    rss0, sys0, t0 = rss_mb(), sys_s(), time.perf_counter()
    cpu0, git0 = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN)
    done: list[list[EpisodeRecord]] = []
    batch = threading.Thread(target=lambda: done.append(run_jobs(rollout, jobs, concurrency=concurrency)))
    batch.start()
    batch.join(args.level_timeout)
    cpu1, git1, sys1, t1 = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN), sys_s(), time.perf_counter()
    common = {
        "n": n,
        "wall_s": t1 - t0,
        "cores": (cpu1 - cpu0) / (t1 - t0),
        "sys_cores": (sys1 - sys0) / (t1 - t0),
        "git_cores": (git1 - git0) / (t1 - t0),
        "rss_mb": rss_mb() - rss0,
    }
    if not done:  # cut off: what its threads are doing says how it was faring
        return common | {"stalled": True, "graded": backend.closed["verify"], "threads": thread_states()}
    (episodes,) = done
    pipeline.store_episodes(store, episodes, lineage, part=f"level-{n}")
    cpu2, t2 = cpu_s(resource.RUSAGE_SELF), time.perf_counter()
    pool.close()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mean_s = statistics.fmean(e.duration_s for e in episodes)
    return common | {
        "stalled": False,
        "episode_s": mean_s,
        "sustained": n / mean_s,  # Little's law: N in flight, each lasting mean_s
        "policy_s": statistics.fmean(e.policy_s for e in episodes),
        "cpu_ms": 1000 * (cpu1 - cpu0) / n,
        "sys_ms": 1000 * (sys1 - sys0) / n,
        "git_ms": 1000 * (git1 - git0) / n,
        "rss_kb": 1024 * (peak_mb - rss0) / n,
        "peak_mb": peak_mb,
        "store_s": t2 - t1,
        "store_cpu_ms": 1000 * (cpu2 - cpu1) / n,
        "agent_sandbox_s": backend.sandbox_s[""] / n,
        "verify_sandbox_s": backend.sandbox_s["verify"] / n,
        "peak_sandboxes": backend.peak_live,
        "left_open": len(backend.live),
        "outcomes": dict(Counter(f"{e.status}/{e.termination}" for e in episodes)),
        "pool": dataclasses.asdict(pool.stats),
    }


def thread_states() -> dict[str, int]:
    """This process's threads by what they are doing: running, waiting on a lock (the GIL, mostly), sleeping out
    a drawn latency, or else."""
    states: Counter[str] = Counter()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            running = (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
            wchan = (task / "wchan").read_text()
            state = "running" if running else "lock" if "futex" in wchan else "sleep" if "sleep" in wchan else "other"
            states[state] += 1
    return dict(states)


# --- 3. report -------------------------------------------------------------------------------------------------
def spawn_level(
    state: Path, n: int, think_s: float, timeout_s: float, args: argparse.Namespace, procs: int = 1
) -> dict[str, Any]:
    """``run_level`` in fresh processes, ``procs`` of them at once with n / procs episodes each (as Ray shards
    spread a batch over controller processes): their peak memory, CPU and threads are the level's own."""
    if n % procs:
        raise SystemExit(f"level {n}x{procs}: {n} episodes do not split evenly over {procs} processes")
    children = []
    for shard in range(procs):
        argv = [sys.executable, __file__, "--level", str(n // procs), "--think-s", str(think_s), "--concurrency",
                str(n // procs), "--state", str(state), "--max-starting", str(args.max_starting), "--seed",
                str(args.seed), "--shard", str(shard), "--level-timeout", str(timeout_s)]  # fmt: skip
        children.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for child in children:
        out, err = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"level {n}x{procs} failed:\n{err[-4000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return combined(results) | {"procs": procs}


# How the figures of a level's processes add up: per-episode figures are means (the processes run equal shares),
# the processes' cores, memory and sandboxes add, wall time is the slowest process's.
_SUMMED = ("n", "cores", "sys_cores", "git_cores", "rss_mb", "graded", "peak_mb", "peak_sandboxes", "left_open")
_LONGEST = ("wall_s", "store_s")


def combined(results: list[dict[str, Any]]) -> dict[str, Any]:
    if len(results) == 1:
        return results[0]
    out: dict[str, Any] = {"stalled": any(r["stalled"] for r in results)}
    for key in results[0]:
        values = [r[key] for r in results if key in r]
        if key == "stalled":
            continue
        if isinstance(values[0], dict):
            out[key] = dict(sum((Counter(v) for v in values), Counter()))
        elif key in _SUMMED:
            out[key] = sum(values)
        elif key in _LONGEST:
            out[key] = max(values)
        else:
            out[key] = statistics.fmean(values)
    if not out["stalled"]:
        out["sustained"] = out["n"] / out["episode_s"]
    return out


def print_levels(levels: list[dict[str, Any]]) -> None:
    heads = ["in flight", "procs", "offered", "sustain", "ep s", "wall s", "CPU ms/ep", "sys", "git ms/ep", "cores",
             "sys", "git", "RSS KB/ep", "peak MB", "store ms/ep", "sbx s/ep", "verify"]  # fmt: skip
    print("\n" + " ".join(f"{h:>{max(5, len(h))}}" for h in heads))
    for lv in levels:
        cut = lv["stalled"]
        cells = [lv["n"], lv["procs"], f"{lv['rate']:g}", "cut off" if cut else f"{lv['sustained']:.1f}"]
        if cut:
            cells += ["-", f"{lv['wall_s']:.0f}", "-", "-", "-"]
        else:
            cells += [f"{lv[k]:{f}}" for k, f in (("episode_s", ".1f"), ("wall_s", ".0f"), ("cpu_ms", ".1f"),
                                                  ("sys_ms", ".0f"), ("git_ms", ".1f"))]  # fmt: skip
        cells += [f"{lv[k]:.2f}" for k in ("cores", "sys_cores", "git_cores")]
        if not cut:
            cells += [f"{lv[k]:{f}}" for k, f in (("rss_kb", ".0f"), ("peak_mb", ".0f"), ("store_cpu_ms", ".2f"),
                                                  ("agent_sandbox_s", ".1f"), ("verify_sandbox_s", ".2f"))]  # fmt: skip
        print(" ".join(f"{c!s:>{max(5, len(h))}}" for c, h in zip(cells, heads, strict=False)))
    for lv in (lv for lv in levels if not lv["stalled"]):
        pool = lv["pool"]
        print(f"  {name(lv)}: {lv['outcomes']}; at most {lv['peak_sandboxes']} sandboxes, "
              f"{lv['left_open']} left open; pool created {pool['created']} (warmed ahead {pool['warmed']}), "
              f"reused {pool['reused']}; store write {lv['store_s']:.1f}s")  # fmt: skip
    print("procs: controller processes the level's episodes were spread over (each its own scheduler, pool and\n"
          "store writer: as Ray shards); cores and memory are their sum, per-episode figures their mean;\n"
          "offered: episodes/s; sustain: in flight / mean episode time (Little's law); ep s: mean episode time;\n"
          "CPU ms/ep: the controller process's CPU per episode (sys: in the kernel), git ms/ep its git processes';\n"
          "cores, sys, git: the same per wall second; RSS KB/ep: peak resident memory above the idle process, per\n"
          "episode in flight; store ms/ep: writing the episodes and steps as Parquet; sbx s/ep, verify: sandbox-\n"
          "seconds per episode, the agent's (idle warm time included) and the grader's")  # fmt: skip


def name(lv: dict[str, Any]) -> str:
    procs = lv.get("procs", 1)
    return f"{lv['n']}@{lv['rate']:g}" + (f"x{procs}" if procs > 1 else "")


def sustained(lv: dict[str, Any]) -> bool:
    return not lv["stalled"] and lv["sustained"] >= SUSTAINED * lv["rate"]


def where_it_stops(levels: list[dict[str, Any]]) -> str:
    held = [lv for lv in levels if sustained(lv)]
    lines = []
    if held:
        cpu, rss = [lv["cpu_ms"] + lv["git_ms"] for lv in held], [lv["rss_kb"] for lv in held]
        names = ", ".join(name(lv) for lv in held)
        lines.append(f"sustained ({names}): controller CPU {min(cpu):.0f}-{max(cpu):.0f} ms and peak memory "
                     f"{min(rss):.0f}-{max(rss):.0f} KB per episode")  # fmt: skip
    for lv in levels:
        busy = (f"the process is {lv['cores']:.2f} cores busy, {lv['sys_cores']:.2f} of them in the kernel, and git "
                f"{lv['git_cores']:.2f}, of {os.cpu_count()}")  # fmt: skip
        if lv["stalled"]:
            threads = lv["threads"]
            locked = threads.get("lock", 0)
            lines.append(
                f"{name(lv)} was cut off after {lv['wall_s']:.0f} s (its episodes last {lv['n'] / lv['rate']:.0f} s "
                f"on average): {lv['graded']} of {lv['n']} graded. Of its {sum(threads.values())} threads "
                f"{threads.get('sleep', 0)} sleep out a drawn latency (thinking, or a sandbox operation), "
                f"{threads.get('running', 0)} run, and {locked} wait on a lock: the workers whose episode is done "
                f"(about {lv['graded']}) and the rest, about {max(0, locked - lv['graded'])}, for the GIL; {busy}; "
                f"resident memory +{lv['rss_mb']:.0f} MB"
            )
        elif not sustained(lv):
            lines.append(
                f"{name(lv)} does not sustain: {lv['sustained']:.1f} of {lv['rate']:g} episodes/s, episodes "
                f"{lv['episode_s'] / (lv['n'] / lv['rate']):.1f}x their offered length, controller CPU "
                f"{lv['cpu_ms'] + lv['git_ms']:.0f} ms per episode: {busy} (the kernel's share: scratch files, and "
                f"the GIL's handoffs among {lv['n'] // lv['procs']} threads a process): CPU-bound"
            )
    return "\n".join(lines)


def print_sizing(
    base: dict[str, Any], levels: list[dict[str, Any]], targets: list[float], episode_s: float, batch: int
) -> None:
    held = [lv for lv in levels if sustained(lv)] or [lv for lv in levels if not lv["stalled"]][:1]
    if not held:
        print("\nno level finished: nothing to size from")
        return
    ceiling = max(lv["rate"] / lv["procs"] for lv in held)  # the highest rate one process sustained here
    most = max(lv["n"] // lv["procs"] for lv in held)  # the most episodes in flight one process sustained here
    cpu_ms = max(lv["cpu_ms"] + lv["git_ms"] for lv in held)
    rss_kb = max(lv["rss_kb"] for lv in held)
    longest = max(held, key=lambda lv: lv["episode_s"])  # the batch's start and end weigh least in it
    hold = longest["agent_sandbox_s"] / longest["episode_s"]  # agent sandbox-seconds per second of episode
    verify = longest["verify_sandbox_s"]
    busy_s = base["episode_s"]  # an episode's time when it thinks for nothing, uncontended
    sandbox_s = hold * episode_s + verify
    print(f"\nsizing for episodes of {episode_s:g} s (assumed) by Little's law (in flight = rate x time in the "
          f"system), with the figures measured above:\n"
          f"  sandboxes   = rate x ({hold:.2f} x {episode_s:g} + {verify:.2f}) sandbox-seconds "
          f"(the agent's per second of episode, idle warm time included; the grader's)\n"
          f"  engines     = rate x ({episode_s:g} - {busy_s:.1f}) s thinking / {batch} episodes per engine "
          f"(assumed: its batch at the turn latency)\n"
          f"  controllers = the larger of rate / {ceiling:g} episodes/s and in flight / {most} episodes (the most "
          f"one process sustained on this {os.cpu_count()}-core machine);\n"
          f"  controller memory = in flight x {rss_kb:.0f} KB; controller cores = rate x {cpu_ms:.0f} ms"
          )  # fmt: skip
    print(f"{'episodes/s':>10} {'in flight':>9} {'sandboxes':>9} {'engines':>7} {'controllers':>11} "
          f"{'ctl GB':>6} {'ctl cores':>9}")  # fmt: skip
    for rate in [*targets, 5000 / sandbox_s]:
        in_flight = rate * episode_s
        controllers = math.ceil(max(rate / ceiling, in_flight / most))
        print(f"{rate:>10.0f} {in_flight:>9.0f} {math.ceil(rate * sandbox_s):>9} "
              f"{math.ceil(rate * (episode_s - busy_s) / batch):>7} {controllers:>11} "
              f"{in_flight * rss_kb / 2**20:>6.1f} {rate * cpu_ms / 1000:>9.1f}")  # fmt: skip
    print(f"(the last row: what a 5,000-sandbox cluster sustains, {5000 / sandbox_s:.0f} episodes/s)")


def level(spec: str) -> tuple[int, float, int]:
    """``N@R`` or ``N@RxK``: N episodes in flight offering R episodes/s, in one process or spread over K."""
    n, _, rest = spec.partition("@")
    rate, _, procs = rest.partition("x")
    return int(n), float(rate), int(procs or 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="100@5,500@10,500@40",
                        help="IN_FLIGHT@EPISODES_PER_S, comma-separated")  # fmt: skip
    parser.add_argument("--episode-s", type=float, default=120.0, help="episode length to size for (assumed)")
    parser.add_argument("--engine-batch", type=int, default=64, help="episodes one inference engine serves at once")
    parser.add_argument("--targets", default="10,100,1000", help="episodes/s to size for, comma-separated")
    parser.add_argument("--max-starting", type=int, default=32, help="sandbox starts at once (a cluster's nodes)")
    parser.add_argument("--tasks", type=int, default=4, help="bundled tasks to validate and cycle through")
    parser.add_argument("--measure-episodes", type=int, default=16, help="real bwrap episodes to measure")
    parser.add_argument("--stored", action="store_true", help="draw from the stored BWRAP_2CORE, not this run's fit")
    parser.add_argument("--measure-only", action="store_true", help="print the fit as Python and stop")
    parser.add_argument("--scratch", default=SHM if Path(SHM).is_dir() else tempfile.gettempdir(),
                        help="temp dir for the episodes' scratch copies and the store (default: tmpfs)")  # fmt: skip
    parser.add_argument("--level-timeout", type=float, default=1800.0, help="a level still running then: cut off")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--level", type=int, help=argparse.SUPPRESS)  # a child process: run one level
    parser.add_argument("--think-s", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--shard", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.level:
        print(json.dumps(run_level(args.state, args.level, args.think_s, args.concurrency, args)), flush=True)
        os._exit(0)  # a stalled level's threads are still running: leave without waiting for them
    with tempfile.TemporaryDirectory(prefix="tf-bench-scale-", dir=args.scratch) as tmp:
        state = Path(tmp)
        # Every episode's scratch copies, the levels' processes' included, go under the state dir: a stalled
        # level's are removed with it.
        os.environ["TMPDIR"] = str(private_dir(state / "tmp"))
        start = time.monotonic()
        tasks, model = measure(state, args.tasks, args.measure_episodes, args.seed)
        model = BWRAP_2CORE if args.stored else model
        print(f"{len(tasks)} tasks validated in {time.monotonic() - start:.0f}s; scratch and store in {state} "
              f"({filesystem(state)})\n{model.table()}")  # fmt: skip
        if args.measure_only:
            print(repr(model))
            return
        (state / "tasks.json").write_text(json.dumps([t.model_dump(mode="json") for t in tasks]))
        (state / "model.json").write_text(json.dumps(dataclasses.asdict(model)))
        base = spawn_level(state, BASELINE, 0.0, BASELINE_TIMEOUT_S, args)
        print(f"\nbaseline, one episode at a time and no thinking: {base['episode_s']:.2f} s and "
              f"{base['cpu_ms'] + base['git_ms']:.0f} ms of controller CPU ({base['git_ms']:.0f} of it git's) per "
              f"episode", flush=True)  # fmt: skip
        levels = []
        for n, rate, procs in (level(spec) for spec in args.levels.split(",")):
            think_s = max(0.0, n / rate - base["episode_s"])  # N in flight offer `rate` when an episode lasts N/rate
            levels.append(spawn_level(state, n, think_s, args.level_timeout, args, procs) | {"rate": rate})
            print(f"  {name(levels[-1])}: {levels[-1]['wall_s']:.0f}s", flush=True)
        print_levels(levels)
        print("\n" + where_it_stops(levels))
        print_sizing(base, levels, [float(t) for t in args.targets.split(",")], args.episode_s, args.engine_batch)


if __name__ == "__main__":
    main()
