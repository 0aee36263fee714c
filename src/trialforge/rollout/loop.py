"""The agent loop: run episodes of a policy in sandboxes, grade them, and record every step.

Episodes take pooled sandboxes and start from their task's post-setup tree (``rollout.starts``). Status keeps
infrastructure out of rewards: a sandbox fault recovery cannot absorb, or an inference server that stops answering,
ends an episode as ``env_error`` (retried), never reward 0. A failed sandbox is restored from the latest checkpoint
and the recorded actions after it run again, at most ``max_recoveries`` times an attempt, each on
``EpisodeRecord.recoveries``; with ``stop`` an episode returns its ``EpisodeState`` for ``Rollout.run`` to continue.
Checkpoints, recovery and resume in detail: docs/rollouts.md, "Recovery, pause and resume". An episode the model
itself ends (``max_turns``, ``context_exhausted``, ``invalid_actions``, ``submitted``) is graded on its diff: every
way an episode ends and who answers for it: docs/learning.md, "Who answers for an episode".
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar, cast

from trialforge.errors import ConfigError, InferenceError, PolicyError, SandboxError, StoreError
from trialforge.rollout.checkpoints import (
    RESTORE,
    RESTORE_TOOL,
    Checkpoints,
    EpisodeState,
    Recovery,
    checkpoint_name,
    episode_prefix,
    is_risky,
    parse_checkpoint_name,
)
from trialforge.rollout.context import ContextExhausted
from trialforge.rollout.env import TOOLS, Action, CodingEnv, EnvLimits, StepOutcome, well_formed
from trialforge.rollout.policies import EpisodePolicy, Policy, TaskView
from trialforge.rollout.settings import RecoveryConfig
from trialforge.rollout.starts import Setup, start_tree
from trialforge.sandbox.base import Backend, Limits, Sandbox
from trialforge.sandbox.pool import PoolConfig, SandboxPool
from trialforge.scratch import scratch_dir
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import EpisodeRecord, StepRecord
from trialforge.tasks.envimages import task_image
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.verify.grader import VERIFIER_VERSION, Grader

log = logging.getLogger(__name__)

READ_ONLY_TOOLS = frozenset({"view", "submit"})  # steps that leave the workspace as it was
_T = TypeVar("_T")
P = TypeVar("P")  # a policy, or its name


@dataclass(frozen=True)
class Lineage:
    run_id: str
    iteration: int
    task_set_version: str
    params_hash: str
    code_version: str


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to run: a task, a policy, the sample's index in its group, and its seed."""

    task: Task
    policy: Policy
    sample: int
    seed: int


def plan_jobs(tasks: list[Task], policies: list[Policy], group_size: int, seed: int) -> list[EpisodeJob]:
    """G jobs per (task, policy), in a stable order, each with its own seed."""
    return [EpisodeJob(*job) for job in planned(tasks, policies, group_size, seed)]


def planned(tasks: list[Task], policies: list[P], group_size: int, seed: int) -> list[tuple[Task, P, int, int]]:
    """(task, policy, sample, seed) for G samples per (task, policy), in a stable order; ``policies`` may be the
    policies or only their names (a shard plan names them: the policy is built where the shard runs)."""
    combos = ((t, p, s) for t in tasks for p in policies for s in range(group_size))
    return [(task, policy, sample, seed * 1_000_003 + i) for i, (task, policy, sample) in enumerate(combos)]


def episode_id(lineage: Lineage, job: EpisodeJob) -> str:
    """Deterministic per (run, iteration, task, policy, sample, seed): a retried, resumed or rerun episode keeps it.

    The seed is part of it because one iteration may draw a task again (a later round, another seed).
    """
    key = [lineage.run_id, lineage.iteration, job.task.task_id, job.policy.name, job.sample, job.seed]
    return "ep-" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Rollout:
    """Everything an episode needs besides the task and the policy."""

    backend: Backend
    image: str  # for tasks that name no image of their own (the base)
    image_digest: str
    snapshots: SnapshotStore
    grader: Grader
    limits: Limits
    env_limits: EnvLimits
    lineage: Lineage
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    store: ObjectStore | None = None  # durable checkpoints (needed to pause); None keeps them in memory
    setup: Setup = field(default_factory=Setup)  # run once per task; its episodes fork the result (``rollout.starts``)
    pool: SandboxPool | None = None  # bounds, creation retries and warm reuse of the episodes' sandboxes

    @cached_property
    def sandboxes(self) -> SandboxPool:
        """The given pool, else one that starts a fresh sandbox for every open and closes it after."""
        return self.pool or SandboxPool(self.backend, self.limits, PoolConfig(max_sandboxes=1 << 20, warm_per_image=0))

    def tools(self) -> list[dict[str, Any]]:
        """The tool schemas a model is offered: the environment's, and ``restore`` when rollback is on."""
        return [*TOOLS, RESTORE_TOOL] if self.recovery.allow_rollback else list(TOOLS)

    def episode(self, task: Task, policy: Policy, sample: int, seed: int) -> EpisodeRecord:
        """One episode, retried on infrastructure faults up to ``env_retries`` times."""
        return cast(EpisodeRecord, self.run(EpisodeJob(task, policy, sample, seed)))  # no stop: never paused

    def run(
        self, job: EpisodeJob, state: EpisodeState | None = None, stop: threading.Event | None = None
    ) -> EpisodeRecord | EpisodeState:
        """Run ``job`` from the start, or continue it from ``state``; retried like ``episode``.

        Once ``stop`` is set the episode stops at its next step boundary and its state is returned instead.
        """
        if stop is not None and self.store is None:
            raise ConfigError("pausing an episode needs durable checkpoints: give the Rollout a store")
        attempt = state.record.attempt if state else 1
        while True:
            outcome = self._attempt(job, attempt, state, stop)
            if (
                isinstance(outcome, EpisodeState)
                or outcome.status != "env_error"
                or attempt > self.recovery.env_retries
            ):
                return outcome
            log.warning("episode %s env_error (attempt %d): %s", outcome.episode_id, attempt, outcome.cause)
            attempt, state = attempt + 1, None

    def _attempt(
        self, job: EpisodeJob, attempt: int, state: EpisodeState | None, stop: threading.Event | None
    ) -> EpisodeRecord | EpisodeState:
        record = state.record if state else self._new_record(job, attempt)
        start = time.monotonic() - (state.elapsed_s if state else 0.0)
        episode: _Episode | None = None
        try:
            episode = _Episode(self, job, record, start, stop)
            ended = episode.run(state)
        except SandboxError as exc:
            record = episode.record if episode else record  # a restart replaces the record
            ended = self._finish(record, start, "env_error", f"{exc.cause}: {exc}", "error")
        except InferenceError as exc:
            record = episode.record if episode else record
            ended = self._finish(record, start, "env_error", f"inference: {exc}", "error")
        except PolicyError as exc:
            record = episode.record if episode else record
            ended = self._finish(record, start, "policy_error", str(exc), "error")
        if isinstance(ended, EpisodeState):
            return ended
        if episode is None:
            return cast(EpisodeRecord, ended)
        # The episode has ended: its record says all its checkpoints did. (Any other exception leaves them, so a
        # batch whose runner died continues from them.)
        episode.checkpoints.clear()
        if isinstance(ended, EpisodeRecord):
            return ended
        return self._graded(job.task, episode, ended)

    def _graded(self, task: Task, episode: _Episode, diff: str) -> EpisodeRecord:
        record = episode.record
        if record.termination == "timeout":
            return self._finish(record, episode.start, "timeout", "episode wall time exceeded", "timeout")
        record.final_diff = diff
        verdict = self.grader.grade(task, diff)
        record.verify_s += verdict.duration_s  # after the time taken to extract the diff
        record.verify_cpu_s = verdict.cpu_s
        record.reward = verdict.reward
        record.verifier_report = json.dumps(verdict.report(), sort_keys=True)
        record.integrity_flags = json.dumps(verdict.flags)
        status, cause = verdict.status, "" if verdict.status == "ok" else verdict.reason
        return self._finish(record, episode.start, status, cause, None)

    def _new_record(self, job: EpisodeJob, attempt: int) -> EpisodeRecord:
        lin, task, policy = self.lineage, job.task, job.policy
        tier = task.difficulty[-1].tier if task.difficulty else "unknown"
        return EpisodeRecord(
            run_id=lin.run_id, iteration=lin.iteration, episode_id=episode_id(lin, job),
            task_id=task.task_id, task_set_version=lin.task_set_version, tier=tier, policy=policy.name,
            policy_version=policy.version, group_id=f"{task.task_id}/{policy.name}", sample=job.sample,
            seed=job.seed, backend=self.backend.name, image_digest=self.image_digest, attempt=attempt, status="ok",
            cause="", termination="", reward=None, verifier_version=VERIFIER_VERSION, verifier_report="{}",
            integrity_flags="[]", final_diff="", steps=0, tool_calls=0, tokens_in=0, tokens_out=0, duration_s=0.0,
            sandbox_s=0.0, policy_s=0.0, exec_s=0.0, verify_s=0.0, params_hash=lin.params_hash,
            code_version=lin.code_version, split=task.split, cpu_s=0.0, verify_cpu_s=0.0,
        )  # fmt: skip

    @staticmethod
    def _finish(record: EpisodeRecord, start: float, status: str, cause: str, termination: str | None) -> EpisodeRecord:
        record.status = status  # type: ignore[assignment]
        record.cause = cause
        if termination is not None:
            record.termination = termination
        if status != "ok":
            record.reward = None  # unknown, not zero
        record.steps = len(record.step_rows)
        record.tool_calls = sum(1 for s in record.step_rows if s.tool != "submit")
        record.tokens_in = sum(s.tokens_in for s in record.step_rows)
        record.tokens_out = sum(s.tokens_out for s in record.step_rows)
        record.duration_s = round(time.monotonic() - start, 4)
        return record


class _Diverged(Exception):
    """A saved episode cannot be continued; it starts again from scratch."""


class _Episode:
    """One attempt of one episode: the conversation, its sandbox, its checkpoints and its recoveries."""

    env: CodingEnv  # over the current sandbox; set when the first one opens

    def __init__(
        self, rollout: Rollout, job: EpisodeJob, record: EpisodeRecord, start: float, stop: threading.Event | None
    ) -> None:
        self.ro = rollout
        self.job = job
        self.record = record
        self.start = start  # monotonic time at which the attempt began (earlier when it was resumed)
        self.stop = stop
        t0 = time.monotonic()
        ro = rollout
        image = task_image(job.task, ro.backend, ro.image)  # the task's environment, else the base
        self.image = image.name
        record.image_digest = image.digest
        base = start_tree(job.task, ro.setup, ro.snapshots, ro.sandboxes, self.image, image.digest)
        record.sandbox_s += time.monotonic() - t0
        prefix = episode_prefix(record.run_id, record.episode_id)
        self.checkpoints = Checkpoints(base, rollout.store, prefix, keep_all=rollout.recovery.allow_rollback)
        self.sandbox: Sandbox | None = None
        self.cpu_start: float | None = None  # the sandbox's CPU counter when the episode took it
        self.dirty = False  # the workspace changed since the latest checkpoint

    def run(self, state: EpisodeState | None) -> str | EpisodeState:
        """The conversation to its end; the final diff against the base snapshot (or the state, if paused)."""
        try:
            if state is None:
                agent, observation = self._begin()
            else:
                try:
                    agent, observation = self._resume(state)
                except _Diverged as exc:
                    agent, observation = self._restart(str(exc))
            return self._converse(agent, observation)
        finally:
            t0 = time.monotonic()
            self._close(reusable=True)
            self.record.sandbox_s += time.monotonic() - t0

    # --- starting ------------------------------------------------------------------------
    def _begin(self) -> tuple[EpisodePolicy, str]:
        self.checkpoints.clear()  # what an earlier attempt left
        t0 = time.monotonic()
        self._open(0)
        self.record.sandbox_s += time.monotonic() - t0
        return self.job.policy.begin(self._view(), self.job.seed), self.env.first_observation()

    def _resume(self, state: EpisodeState) -> tuple[EpisodePolicy, str]:
        """Continue a saved episode: fast-forward the policy, restore the workspace, replay after the checkpoint."""
        t0 = time.monotonic()
        policy, step = self.job.policy, state.step
        if policy.version != self.record.policy_version:
            ran = self.record.policy_version
            raise _Diverged(f"policy {policy.name} is at version {policy.version}, the episode ran version {ran}")
        self.checkpoints.adopt(state.checkpoints)
        try:
            self._open(state.checkpoint)
            diverged = self._replay(state.checkpoint, step)
        except StoreError as exc:
            raise _Diverged(f"checkpoint {checkpoint_name(state.checkpoint)} cannot be read: {exc}") from exc
        except SandboxError as exc:
            self._recover(step, exc)
            diverged = []  # the recovery records its own replay
        agent = policy.begin(self._view(), self.job.seed)
        observation = self._fast_forward(agent)
        self.dirty = any(r.tool not in READ_ONLY_TOOLS for r in self.record.step_rows[state.checkpoint :])
        seconds, replayed = round(time.monotonic() - t0, 4), step - state.checkpoint
        note = f"fast-forwarded the policy over {step} steps"
        self._note(Recovery("resume", step, "resumed", note, state.checkpoint, replayed, diverged, seconds))
        return agent, observation

    def _fast_forward(self, agent: EpisodePolicy) -> str:
        """Feed the policy the recorded observations; it must choose the recorded actions again."""
        observation = self.env.first_observation()
        for row in self.record.step_rows:
            chosen = agent.act(observation).action
            args = json.dumps(chosen.args, sort_keys=True)
            if (chosen.tool, args) != (row.tool, row.args):
                raise _Diverged(
                    f"policy {self.job.policy.name}@{self.job.policy.version} is not deterministic: given the recorded "
                    f"observations it chose {chosen.tool} {args[:200]} at step {row.step}, the recording has "
                    f"{row.tool} {row.args[:200]}"
                )
            observation = row.observation
        return observation

    def _restart(self, reason: str) -> tuple[EpisodePolicy, str]:
        log.warning("episode %s restarts from scratch: %s", self.record.episode_id, reason)
        event = Recovery("restart", len(self.record.step_rows), "not_continued", reason)
        events = [*json.loads(self.record.recoveries), event.as_dict()]
        self.record = self.ro._new_record(self.job, self.record.attempt)
        self.record.recoveries = json.dumps(events)
        self.dirty = False
        return self._begin()

    # --- the conversation ----------------------------------------------------------------
    def _converse(self, agent: EpisodePolicy, observation: str) -> str | EpisodeState:
        record, every, limits = self.record, self.ro.recovery.checkpoint_every, self.ro.env_limits
        offered = frozenset(t["function"]["name"] for t in self.ro.tools())
        bad = 0  # replies in a row that were no well-formed tool call
        record.termination = "max_turns"
        for step in range(len(record.step_rows), limits.max_turns):
            if self.env.out_of_time():
                record.termination = "timeout"
                break
            if self.stop is not None and self.stop.is_set():
                return self._pause()
            if self.dirty and every and step - self.checkpoints.latest >= every:
                self._checkpoint()
            p0 = time.monotonic()
            try:
                decision = agent.act(observation)
            except ContextExhausted as exc:
                record.policy_s += time.monotonic() - p0
                log.info("episode %s: context exhausted at step %d: %s", record.episode_id, step, exc)
                record.termination = "context_exhausted"
                break
            policy_s = time.monotonic() - p0
            if self.dirty and is_risky(decision.action):
                self._checkpoint()
            outcome = self._step(step, decision.action)
            record.step_rows.append(
                StepRecord(
                    run_id=record.run_id,
                    iteration=record.iteration,
                    episode_id=record.episode_id,
                    step=step,
                    tool=decision.action.tool,
                    args=json.dumps(decision.action.args, sort_keys=True),
                    observation=outcome.observation,
                    action_error=outcome.error,
                    exec_s=outcome.exec_s,
                    policy_s=policy_s,
                    tokens_in=decision.tokens_in,
                    tokens_out=decision.tokens_out,
                    logprob=decision.logprob,
                    info=json.dumps(decision.info, sort_keys=True),
                )
            )
            record.policy_s += policy_s
            record.exec_s += outcome.exec_s
            self.dirty = self.dirty or decision.action.tool not in READ_ONLY_TOOLS
            observation = outcome.observation
            if outcome.done:
                record.termination = "submitted"
                break
            bad = 0 if well_formed(decision.action, offered) else bad + 1
            if limits.max_bad_actions and bad >= limits.max_bad_actions:
                record.termination = "invalid_actions"
                break
        return self._guarded(len(record.step_rows), self._final_diff)

    def _step(self, step: int, action: Action) -> StepOutcome:
        """Execute one action, recovering the sandbox if it fails; a second failure in a row is the action's."""
        try:
            return self._execute(action)
        except SandboxError as exc:
            self._recover(step, exc)
        try:
            return self._execute(action)
        except SandboxError as exc:
            self._recover(step, exc, blamed=True)
            return StepOutcome(
                f"error: this action broke the sandbox twice in a row ({exc.cause}); "
                "the repository is back to its state before it",
                False,
                True,
                0.0,
            )

    def _execute(self, action: Action) -> StepOutcome:
        sandbox = self._live()
        if self.ro.recovery.allow_rollback and action.tool == RESTORE:
            outcome = self._rollback(action, sandbox)
        else:
            outcome = self.env.step(action)
        self._live()  # a dead sandbox can answer a file operation with "no such file": that is no observation
        return outcome

    def _rollback(self, action: Action, sandbox: Sandbox) -> StepOutcome:
        start = time.monotonic()
        name = action.args.get("name")
        step = parse_checkpoint_name(name)
        listed = f"checkpoints: {', '.join(self.checkpoints.names())}"
        if step is None or step not in self.checkpoints.steps:
            return StepOutcome(f"error: no checkpoint named {name!r}; {listed}", False, True, 0.0)
        with self.checkpoints.tree(step) as tree:
            sandbox.reset(tree)
        text = f"restored {name}: the repository is as it was before action {step}; {listed}"
        return StepOutcome(text, False, False, time.monotonic() - start)

    def _final_diff(self) -> str:
        """The agent's diff against its start: the verifier's first step, so its time counts as verification."""
        t0 = time.monotonic()
        with scratch_dir("final") as tmp:  # named for its owner: `trialforge reap` removes it after a kill -9
            final = Path(tmp) / "work"
            self._export(final)
            diff = diff_trees(self.checkpoints.base, final)
        self.record.verify_s += time.monotonic() - t0
        return diff

    # --- checkpoints, pause, recovery ------------------------------------------------------
    def _checkpoint(self) -> None:
        take = self.checkpoints.take
        self._guarded(len(self.record.step_rows), lambda: take(self._export, self.record, self._elapsed()))
        self.dirty = False

    def _pause(self) -> EpisodeState:
        if self.dirty:
            self._checkpoint()
        log.info("episode paused", extra={"episode": self.record.episode_id, "step": len(self.record.step_rows)})
        return self.checkpoints.state(self.record, self._elapsed())

    def _guarded(self, step: int, op: Callable[[], _T]) -> _T:
        """``op`` on the sandbox, recovering it as often as allowed if it fails."""
        while True:
            try:
                return op()
            except SandboxError as exc:
                self._recover(step, exc)

    def _recover(self, step: int, exc: SandboxError, *, blamed: bool = False) -> None:
        """A new sandbox at the state before ``step``: the latest checkpoint, then the recorded actions after it."""
        kind = "action" if blamed else "sandbox"
        while True:
            events = json.loads(self.record.recoveries)
            if sum(1 for e in events if e["kind"] in ("sandbox", "action")) >= self.ro.recovery.max_recoveries:
                raise exc
            t0, checkpoint = time.monotonic(), self.checkpoints.latest
            log.warning(
                "sandbox failed; restoring",
                extra={"episode": self.record.episode_id, "step": step, "checkpoint": checkpoint, "error": str(exc)},
            )
            try:
                self._open(checkpoint)
                diverged = self._replay(checkpoint, step)
            except SandboxError as again:
                self._note(Recovery(kind, step, exc.cause, str(exc), checkpoint, ok=False))
                exc = again
                continue
            seconds = round(time.monotonic() - t0, 4)
            self._note(Recovery(kind, step, exc.cause, str(exc), checkpoint, step - checkpoint, diverged, seconds))
            return

    def _replay(self, start: int, end: int) -> list[int]:
        """Execute the recorded actions of steps ``start..end-1`` again; return those whose observation differed."""
        broke = {e["step"] for e in json.loads(self.record.recoveries) if e["kind"] == "action" and e["ok"]}
        diverged = []
        for row in self.record.step_rows[start:end]:
            if row.step in broke:  # it had no effect: the workspace went back to before it
                continue
            outcome = self._execute(Action(tool=row.tool, args=json.loads(row.args)))
            if outcome.observation != row.observation:
                diverged.append(row.step)
        return diverged

    def _note(self, event: Recovery) -> None:
        self.record.recoveries = json.dumps([*json.loads(self.record.recoveries), event.as_dict()])

    # --- the sandbox -----------------------------------------------------------------------
    def _open(self, checkpoint: int) -> None:
        """Replace the sandbox (if any: it failed) by a new one whose workspace is ``checkpoint``."""
        self._close(reusable=False)
        with self.checkpoints.tree(checkpoint) as tree:
            self.sandbox = self.ro.sandboxes.acquire(self.image, tree, labels={"episode": self.record.episode_id})
        self.cpu_start = self.sandbox.cpu_s()
        build = self.job.task.env.build if self.job.task.env is not None else None
        self.env = CodingEnv(self.sandbox, self.job.task.problem_statement, self.ro.env_limits, self.ro.limits, build)
        self.env.started = self.start  # the episode's clock, not this sandbox's

    def _live(self) -> Sandbox:
        """The sandbox, if it is still there (a health check that costs no command)."""
        if self.sandbox is None or not self.sandbox.alive():
            raise SandboxError(f"the sandbox of episode {self.record.episode_id} is gone", cause="died")
        return self.sandbox

    def _export(self, dest: Path) -> None:
        sandbox = self._live()
        try:
            sandbox.export_workspace(dest)
        except OSError:
            self._live()  # a sandbox that died during the copy is a sandbox failure
            raise
        self._live()

    def _close(self, *, reusable: bool) -> None:
        """Give the sandbox back: to be reused if the episode ended with it healthy, else to be closed."""
        if self.sandbox is not None:
            sandbox, self.sandbox = self.sandbox, None
            self._count_cpu(sandbox)
            if reusable:
                self.ro.sandboxes.release(sandbox, self.image)
            else:
                self.ro.sandboxes.discard(sandbox)

    def _count_cpu(self, sandbox: Sandbox) -> None:
        """Add what ``sandbox`` used since the episode took it; one unreadable sandbox makes the episode unmeasured."""
        end, start, total = sandbox.cpu_s(), self.cpu_start, self.record.cpu_s
        used = None if end is None or start is None or end < start else end - start
        self.record.cpu_s = None if total is None or used is None else round(total + used, 4)

    def _view(self) -> TaskView:
        return TaskView(self.job.task.task_id, self.job.task.problem_statement)

    def _elapsed(self) -> float:
        return round(time.monotonic() - self.start, 4)


def run_jobs(rollout: Rollout, jobs: list[EpisodeJob], concurrency: int) -> list[EpisodeRecord]:
    """Run ``jobs`` ``concurrency`` at a time; results in job order.

    A task's episodes all fork its one post-setup tree (``rollout.starts``): the first to start sets it up,
    the others of its group wait for it instead of repeating the setup.
    """
    with ThreadPoolExecutor(max_workers=max(concurrency, 1)) as pool:
        return list(pool.map(lambda job: rollout.episode(job.task, job.policy, job.sample, job.seed), jobs))


def run_batch(
    rollout: Rollout, tasks: list[Task], policies: list[Policy], group_size: int, seed: int, concurrency: int
) -> list[EpisodeRecord]:
    """G episodes per (task, policy), run concurrently; results in a stable order."""
    return run_jobs(rollout, plan_jobs(tasks, policies, group_size, seed), concurrency)
