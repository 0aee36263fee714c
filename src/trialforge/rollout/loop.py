"""The agent loop: run episodes of a policy in sandboxes, grade them, and record every step.

Status keeps infrastructure out of rewards: a sandbox fault ends an episode as
``env_error`` (retried), never as reward 0; only ``ok`` episodes carry a reward.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from trialforge.errors import PolicyError, SandboxError
from trialforge.rollout.env import CodingEnv, EnvLimits
from trialforge.rollout.policies import Policy, TaskView
from trialforge.rollout.records import EpisodeRecord, StepRecord
from trialforge.sandbox.base import Backend, Limits, SandboxSpec
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.verify.grader import VERIFIER_VERSION, Grader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lineage:
    run_id: str
    iteration: int
    task_set_version: str
    params_hash: str
    code_version: str


@dataclass(frozen=True)
class Rollout:
    """Everything an episode needs besides the task and the policy."""

    backend: Backend
    image: str
    image_digest: str
    snapshots: SnapshotStore
    grader: Grader
    limits: Limits
    env_limits: EnvLimits
    lineage: Lineage
    env_retries: int = 1

    def episode(self, task: Task, policy: Policy, sample: int, seed: int) -> EpisodeRecord:
        """One episode, retried on infrastructure faults up to ``env_retries`` times."""
        for attempt in range(1, self.env_retries + 2):
            record = self._attempt(task, policy, sample, seed, attempt)
            if record.status != "env_error":
                break
            log.warning("episode %s env_error (attempt %d): %s", record.episode_id, attempt, record.cause)
        return record

    def _attempt(self, task: Task, policy: Policy, sample: int, seed: int, attempt: int) -> EpisodeRecord:
        record = self._new_record(task, policy, sample, seed, attempt)
        start = time.monotonic()
        try:
            diff = self._interact(task, policy, seed, record)
        except SandboxError as exc:
            return self._finish(record, start, "env_error", f"{exc.cause}: {exc}", "error")
        except PolicyError as exc:
            return self._finish(record, start, "policy_error", str(exc), "error")
        if record.termination == "timeout":
            return self._finish(record, start, "timeout", "episode wall time exceeded", "timeout")
        record.final_diff = diff
        verdict = self.grader.grade(task, diff)
        record.verify_s = verdict.duration_s
        record.reward = verdict.reward
        record.verifier_report = json.dumps(verdict.report(), sort_keys=True)
        record.integrity_flags = json.dumps(verdict.flags)
        return self._finish(record, start, verdict.status, "" if verdict.status == "ok" else verdict.reason, None)

    def _interact(self, task: Task, policy: Policy, seed: int, record: EpisodeRecord) -> str:
        """Run the conversation; return the final diff against the base snapshot."""
        t0 = time.monotonic()
        base = self.snapshots.materialize(task.snapshot)
        spec = SandboxSpec(image=self.image, workspace=base, limits=self.limits, labels={"episode": record.episode_id})
        sandbox = self.backend.create(spec)
        record.sandbox_s = time.monotonic() - t0
        try:
            env = CodingEnv(sandbox, task.problem_statement, self.env_limits)
            agent = policy.begin(TaskView(task.task_id, task.problem_statement), seed)
            observation = env.first_observation()
            record.termination = "max_turns"
            for step in range(self.env_limits.max_turns):
                if env.out_of_time():
                    record.termination = "timeout"
                    break
                p0 = time.monotonic()
                decision = agent.act(observation)
                policy_s = time.monotonic() - p0
                outcome = env.step(decision.action)
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
                observation = outcome.observation
                if outcome.done:
                    record.termination = "submitted"
                    break
            with tempfile.TemporaryDirectory(prefix="tf-final-") as tmp:
                final = Path(tmp) / "work"
                sandbox.export_workspace(final)
                return diff_trees(base, final)
        finally:
            sandbox.close()

    def _new_record(self, task: Task, policy: Policy, sample: int, seed: int, attempt: int) -> EpisodeRecord:
        lin = self.lineage
        tier = task.difficulty[-1].tier if task.difficulty else "unknown"
        return EpisodeRecord(
            run_id=lin.run_id, iteration=lin.iteration, episode_id=f"ep-{uuid.uuid4().hex[:12]}",
            task_id=task.task_id, task_set_version=lin.task_set_version, tier=tier, policy=policy.name,
            policy_version=policy.version, group_id=f"{task.task_id}/{policy.name}", sample=sample, seed=seed,
            backend=self.backend.name, image_digest=self.image_digest, attempt=attempt, status="ok", cause="",
            termination="", reward=None, verifier_version=VERIFIER_VERSION, verifier_report="{}",
            integrity_flags="[]", final_diff="", steps=0, tool_calls=0, tokens_in=0, tokens_out=0, duration_s=0.0,
            sandbox_s=0.0, policy_s=0.0, exec_s=0.0, verify_s=0.0, params_hash=lin.params_hash,
            code_version=lin.code_version,
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


def run_batch(
    rollout: Rollout, tasks: list[Task], policies: list[Policy], group_size: int, seed: int, concurrency: int
) -> list[EpisodeRecord]:
    """G episodes per (task, policy), run concurrently; results in a stable order."""
    jobs = [
        (task, policy, sample, seed * 1_000_003 + i)
        for i, (task, policy, sample) in enumerate(
            (t, p, s) for t in tasks for p in policies for s in range(group_size)
        )
    ]
    with ThreadPoolExecutor(max_workers=max(concurrency, 1)) as pool:
        return list(pool.map(lambda job: rollout.episode(*job), jobs))
