"""Batches of episodes: 64 episodes over 8 concurrent sandboxes, a crash ending as env_error and retried, groups
forked from one post-setup tree, warm sandboxes reused, replay of recorded actions.

Everything runs in real bubblewrap sandboxes on bundled tasks; the crash is real too (the episode's sandbox is
taken away mid-episode, as a reaper or a lost disk would).
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.worlds import LINEAGE, bundled_world, kill_bwrap, make_rollout

from trialforge.rollout.env import Action
from trialforge.rollout.loop import EpisodeJob, episode_id, plan_jobs, run_batch, run_jobs
from trialforge.rollout.policies import Decision, EpisodePolicy, ReplayPolicy, TaskView, patch_to_actions
from trialforge.rollout.starts import Setup
from trialforge.sandbox.base import Limits
from trialforge.sandbox.pool import PoolConfig, SandboxPool

pytestmark = pytest.mark.sandbox

REPO_ROOT = Path(__file__).resolve().parents[1]
TASK_IDS = ("ledgerlite-3", "textkit-21", "schedwise-52", "ledgerlite-6")
HOLD = Action(tool="run", args={"command": "python3 -c 'import time; time.sleep(0.8)'"})  # keeps sandboxes busy


class Counting:
    """The bwrap backend, counting the sandboxes alive at once (instrumentation: every sandbox is real)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name
        self.image_for = inner.image_for
        self.live = self.peak = 0
        self.lock = threading.Lock()

    def create(self, spec: Any) -> Any:
        sandbox = self.inner.create(spec)
        with self.lock:
            self.live += 1
            self.peak = max(self.peak, self.live)
        close = sandbox.close

        def counted_close() -> None:
            if not sandbox.closed:
                with self.lock:
                    self.live -= 1
            close()

        sandbox.close = counted_close
        return sandbox


class Crashing:
    """``inner`` (same name and version, so the same episode ids), but the episode with ``seed`` loses its sandbox
    just before its second action, on its first ``attempts`` attempts."""

    def __init__(self, inner: Any, backend: Any, seed: int, attempts: int) -> None:
        self.inner, self.backend, self.seed, self.attempts = inner, backend, seed, attempts
        self.name, self.version = inner.name, inner.version
        self.begun = 0
        self.episode = ""

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        agent = self.inner.begin(view, seed)
        if seed != self.seed:
            return agent
        self.begun += 1
        return _CrashAt(agent, lambda: kill_bwrap(self.backend, self.episode)) if self.begun <= self.attempts else agent


class _CrashAt:
    def __init__(self, agent: EpisodePolicy, crash: Any) -> None:
        self.agent, self.crash, self.acts = agent, crash, 0

    def act(self, observation: str) -> Decision:
        self.acts += 1
        if self.acts == 2:
            self.crash()
        return self.agent.act(observation)


@pytest.fixture(scope="module")
def world(bwrap_backend, tmp_path_factory) -> SimpleNamespace:
    return bundled_world(tmp_path_factory.mktemp("batch"), bwrap_backend, TASK_IDS)


def fixer_and_idler(tasks: list) -> tuple[ReplayPolicy, ReplayPolicy]:
    fixes = {t.task_id: [HOLD, *patch_to_actions(t.gold_patch)] for t in tasks}
    return ReplayPolicy(fixes, name="fixer"), ReplayPolicy({t.task_id: [HOLD] for t in tasks}, name="idler")


@pytest.mark.slow
def test_64_episodes_over_8_concurrent_sandboxes_account_for_every_status_and_a_crash_is_retried(
    world, bwrap_backend
) -> None:
    counting = Counting(bwrap_backend)
    fixer, idler = fixer_and_idler(world.tasks)
    jobs = plan_jobs(world.tasks, [fixer, idler], group_size=8, seed=3)
    assert len(jobs) == 64
    # One fixer episode crashes once (retried: ends ok on attempt 2); one idler episode crashes on both attempts.
    once, always = jobs[5], jobs[8 * 3 + 2]
    crash_once = Crashing(fixer, bwrap_backend, once.seed, attempts=1)
    crash_always = Crashing(idler, bwrap_backend, always.seed, attempts=2)
    crash_once.episode, crash_always.episode = episode_id(LINEAGE, once), episode_id(LINEAGE, always)
    policies = {"fixer": crash_once, "idler": crash_always}
    jobs = [EpisodeJob(j.task, policies[j.policy.name], j.sample, j.seed) for j in jobs]
    pool = SandboxPool(counting, Limits(), PoolConfig(max_sandboxes=8, max_starting=4, warm_per_image=0))
    runner = make_rollout(world, counting, pool=pool, max_recoveries=0)  # no in-episode recovery: the retry path

    episodes = run_jobs(runner, jobs, concurrency=8)

    assert len(episodes) == 64 and len({e.episode_id for e in episodes}) == 64
    assert counting.peak == 8 and counting.live == 0
    statuses = Counter((e.policy, e.status, e.reward) for e in episodes)
    assert statuses == {("fixer", "ok", 1.0): 32, ("idler", "ok", 0.0): 31, ("idler", "env_error", None): 1}
    by_id = {e.episode_id: e for e in episodes}
    retried = by_id[crash_once.episode]
    assert (retried.status, retried.attempt, retried.reward) == ("ok", 2, 1.0)
    failed = by_id[crash_always.episode]
    assert (failed.status, failed.attempt, failed.reward, failed.termination) == ("env_error", 2, None, "error")
    assert "died" in failed.cause
    assert Counter(e.attempt for e in episodes) == {1: 62, 2: 2}
    assert all(e.sandbox_s > 0 and e.verify_s > 0 for e in episodes if e.status == "ok")


def test_a_group_forks_one_post_setup_tree_and_the_setup_runs_once_per_task(world, bwrap_backend) -> None:
    stamp = "cat /proc/sys/kernel/random/uuid > .setup-stamp"  # a different value every time the setup runs
    reader = ReplayPolicy({t.task_id: [Action(tool="run", args={"command": "cat .setup-stamp"})] for t in world.tasks})
    runner = make_rollout(world, bwrap_backend, setup=Setup(stamp))
    episodes = run_batch(runner, world.tasks[:2], [reader], group_size=4, seed=11, concurrency=4)

    seen = {(e.task_id, e.step_rows[0].observation) for e in episodes}
    assert len(seen) == 2 and len({obs for _, obs in seen}) == 2  # one stamp per task, shared by its group
    assert all(e.status == "ok" and e.final_diff == "" for e in episodes)  # the setup is the start, not the diff
    assert len(list((world.root / "starts").iterdir())) == 2
    again = run_batch(runner, world.tasks[:2], [reader], group_size=2, seed=12, concurrency=2)
    assert {(e.task_id, e.step_rows[0].observation) for e in again} == seen  # cached: not set up again


def test_a_failing_setup_ends_its_episodes_as_env_error_never_reward_0(world, bwrap_backend) -> None:
    reader = ReplayPolicy({t.task_id: [] for t in world.tasks})
    runner = make_rollout(world, bwrap_backend, setup=Setup("echo 'no such package' >&2; exit 3"))
    episodes = run_batch(runner, world.tasks[:1], [reader], group_size=2, seed=1, concurrency=2)
    assert [(e.status, e.reward, e.attempt) for e in episodes] == [("env_error", None, 2)] * 2
    assert all("setup of task" in e.cause and "no such package" in e.cause for e in episodes)


def test_warm_sandboxes_are_reused_between_episodes_with_a_clean_workspace(world, bwrap_backend) -> None:
    fixer, _ = fixer_and_idler(world.tasks)
    leftover = ReplayPolicy({t.task_id: [Action(tool="run", args={"command": "ls -a; touch LEFTOVER"})]
                             for t in world.tasks}, name="leftover")  # fmt: skip
    pool = SandboxPool(bwrap_backend, Limits(), PoolConfig(max_sandboxes=2, warm_per_image=2))
    try:
        runner = make_rollout(world, bwrap_backend, pool=pool)
        episodes = run_batch(runner, world.tasks, [leftover, fixer], group_size=2, seed=5, concurrency=2)
    finally:
        pool.close()
    assert pool.stats.reused >= len(episodes) - 2  # only the first two episodes started a sandbox
    assert all("LEFTOVER" not in e.step_rows[0].observation for e in episodes if e.policy == "leftover")
    assert all(e.status == "ok" for e in episodes)
    assert {e.policy: e.reward for e in episodes} == {"leftover": 0.0, "fixer": 1.0}


def test_replaying_a_recorded_episode_repeats_its_steps_diff_and_reward(world, bwrap_backend) -> None:
    fixer, _ = fixer_and_idler(world.tasks)
    runner = make_rollout(world, bwrap_backend)
    (first,) = run_batch(runner, world.tasks[:1], [fixer], group_size=1, seed=9, concurrency=1)
    replay = ReplayPolicy.from_episodes([first])
    (again,) = run_batch(runner, world.tasks[:1], [replay], group_size=1, seed=9, concurrency=1)
    steps = [(s.tool, s.args, s.observation) for s in first.step_rows]
    assert [(s.tool, s.args, s.observation) for s in again.step_rows] == steps
    assert (again.final_diff, again.reward) == (first.final_diff, 1.0)
    missing = ReplayPolicy({})
    (lost,) = run_batch(runner, world.tasks[:1], [missing], group_size=1, seed=9, concurrency=1)
    assert (lost.status, lost.reward) == ("policy_error", None)
    assert "no recording for task" in lost.cause
