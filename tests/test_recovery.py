"""Long episodes survive sandbox failures: checkpoints, recovery, pause and resume in another process, rollback.

Sandboxes are killed for real in the middle of an episode (bwrap: its workspace and its mount removed, as a
reaper or a lost host disk would; the container backend: the container removed through the engine API), and
the recovered episode must end with the same steps, diff and reward as an uninterrupted one. The batch test
pauses 18 episodes mid-way here and resumes them in a new process: this file is also that process's script
(``python tests/test_recovery.py CONFIG.json``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.worlds import LINEAGE, Script, Wander, bundled_world, kill_bwrap, make_rollout, open_world

from trialforge.errors import PolicyError
from trialforge.rollout.checkpoints import RESTORE_TOOL, EpisodeState, is_risky
from trialforge.rollout.env import Action
from trialforge.rollout.loop import EpisodeJob, Lineage, episode_id, plan_jobs
from trialforge.rollout.policies import Decision, EpisodePolicy, GoldPolicy, NoopPolicy, TaskView, patch_to_actions
from trialforge.rollout.resumable import ResumableBatch
from trialforge.sandbox.bwrap.backend import BwrapBackend
from trialforge.sandbox.images import base_image
from trialforge.store.records import EpisodeRecord
from trialforge.tasks.schema import Task

REPO_ROOT = Path(__file__).resolve().parents[1]
TASK_ID = "ledgerlite-3"  # a two-hunk fix: the wandering policy edits, runs and views around it
BATCH_SEED = 7


# --- policies ------------------------------------------------------------------------------------------------


class Fickle(Wander):
    """Like ``Wander``, but its first look is at random lines: it cannot be fast-forwarded."""

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        script = super().begin(view, seed)
        assert isinstance(script, Script)
        start = random.SystemRandom().randrange(1, 1000)
        script.actions[1] = Action(tool="view", args={**script.actions[1].args, "start": start, "end": start + 5})
        return script


class Trigger:
    """``inner`` under the same name and version (so the same episode ids), calling ``fire`` once: just before
    the ``at``-th action of the episode with ``seed``."""

    def __init__(self, inner: Any, seed: int, at: int, fire: Callable[[], None]) -> None:
        self.inner, self.seed, self.at, self.fire = inner, seed, at, fire
        self.name, self.version = inner.name, inner.version

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        agent = self.inner.begin(view, seed)
        return _Firing(agent, self.at, self.fire) if seed == self.seed else agent


class _Firing:
    def __init__(self, agent: EpisodePolicy, at: int, fire: Callable[[], None]) -> None:
        self.agent, self.at, self.fire, self.acts = agent, at, fire, 0

    def act(self, observation: str) -> Decision:
        if self.acts == self.at:
            self.fire()
        self.acts += 1
        return self.agent.act(observation)


class Failing:
    """Raises a policy error at its third action."""

    name, version = "failing", "scripted"

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        return _FailingAgent()


class _FailingAgent:
    acts = 0

    def act(self, observation: str) -> Decision:
        self.acts += 1
        if self.acts == 3:
            raise PolicyError("the model answered no tool call")
        return Decision(Action(tool="run", args={"command": "true"}))


# --- faults ----------------------------------------------------------------------------------------------------


def kill_container(client: Any, episode: str) -> None:
    """Remove the episode's container through the engine API, as an operator or a node drain would."""
    found = client.api.containers(filters={"label": f"episode={episode}"})
    assert len(found) == 1, found
    client.api.remove_container(found[0]["Id"], force=True)


class BreaksOn:
    """A backend whose sandboxes really close when told to run a command containing ``marker``.

    A stand-in for a command that takes its own sandbox down, which neither backend lets a command do.
    """

    def __init__(self, inner: Any, marker: str) -> None:
        self.inner, self.marker, self.name = inner, marker, inner.name
        self.image_for = inner.image_for

    def create(self, spec: Any) -> Any:
        return _Breaking(self.inner.create(spec), self.marker)


class _Breaking:
    def __init__(self, inner: Any, marker: str) -> None:
        self.inner, self.marker = inner, marker

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def exec(self, argv: list[str], **kwargs: Any) -> Any:
        if self.marker in argv[-1]:
            self.inner.close()
        return self.inner.exec(argv, **kwargs)


# --- setup -----------------------------------------------------------------------------------------------------


def batch_jobs(tasks: list[Task], wander: Any) -> list[EpisodeJob]:
    """The paused batch: 18 episodes, six each of gold, noop and wander."""
    return plan_jobs(tasks, [GoldPolicy(tasks), NoopPolicy(), wander], group_size=6, seed=BATCH_SEED)


@pytest.fixture(scope="module")
def world(bwrap_backend, tmp_path_factory) -> SimpleNamespace:
    """One bundled task (its verdicts shared by every test here), also written out for the resuming process."""
    world = bundled_world(tmp_path_factory.mktemp("recovery"), bwrap_backend, (TASK_ID,))
    (world.root / "tasks.json").write_text(json.dumps([t.model_dump(mode="json") for t in world.tasks]))
    return world


def trajectory(record: EpisodeRecord) -> list[tuple[str, str, str]]:
    return [(s.tool, s.args, s.observation) for s in record.step_rows]


# --- pure pieces -----------------------------------------------------------------------------------------------
@pytest.mark.pure
@pytest.mark.parametrize(
    ("command", "risky"),
    [
        ("rm -rf build", True),
        ("cd src && mv a.py b.py", True),
        ("python -m pip install x", True),
        ("find . -name '*.tmp' -delete", True),
        ("chmod +x run.sh; ./run.sh", True),
        ("git checkout -- .", True),
        ("python3 -m pytest -q", False),
        ("ls -rm", False),
        ("cat form.txt ./rm.py", False),
    ],
)
def test_risky_commands_are_recognised_by_their_command_words(command: str, risky: bool) -> None:
    assert is_risky(Action(tool="run", args={"command": command})) is risky
    assert not is_risky(Action(tool="create", args={"path": "rm", "content": command}))


@pytest.mark.sandbox
def test_episode_ids_are_deterministic_per_run_iteration_task_policy_sample_and_seed(world) -> None:
    task = world.tasks[0]
    job = EpisodeJob(task, NoopPolicy(), 0, 11)
    again = EpisodeJob(task, NoopPolicy(), 0, 11)
    others = [
        EpisodeJob(task, NoopPolicy(), 1, 11),
        EpisodeJob(task, NoopPolicy(), 0, 12),
        EpisodeJob(task.model_copy(update={"task_id": "other"}), NoopPolicy(), 0, 11),
        EpisodeJob(task, GoldPolicy(world.tasks), 0, 11),
    ]
    assert episode_id(LINEAGE, job) == episode_id(LINEAGE, again)
    ids = {episode_id(LINEAGE, j) for j in [job, *others]} | {episode_id(Lineage("r2", 0, "t", "p", "c"), job)}
    assert len(ids) == 6


# --- recovery --------------------------------------------------------------------------------------------------
@pytest.mark.sandbox
@pytest.mark.parametrize("backend_name", ["bwrap", pytest.param("docker", marks=pytest.mark.slow)])
def test_an_episode_whose_sandbox_is_killed_at_a_random_step_ends_as_if_nothing_happened(
    world, request, backend_name: str
) -> None:
    if backend_name == "bwrap":
        backend = request.getfixturevalue("bwrap_backend")
        kill = lambda episode: kill_bwrap(backend, episode)  # noqa: E731
    else:
        backend = request.getfixturevalue("docker_backend")
        client = request.getfixturevalue("docker_client")
        kill = lambda episode: kill_container(client, episode)  # noqa: E731
    rollout = make_rollout(world, backend)
    task, wander, seed = world.tasks[0], Wander(world.tasks), 5
    clean = rollout.episode(task, wander, 0, seed)
    assert (clean.status, clean.reward, json.loads(clean.recoveries)) == ("ok", 1.0, [])

    at = random.Random(f"kill-{backend_name}").randrange(1, clean.steps)  # just before one of its actions
    job = EpisodeJob(task, wander, 0, seed)
    eid = episode_id(LINEAGE, job)
    stored_then: list[str] = []

    def fire() -> None:
        stored_then.extend(world.store.list(f"checkpoints/episodes/{LINEAGE.run_id}/{eid}/"))
        kill(eid)

    hurt = rollout.episode(task, Trigger(wander, seed, at, fire), 0, seed)

    assert (hurt.status, hurt.reward, hurt.final_diff) == ("ok", 1.0, clean.final_diff), hurt.cause
    assert trajectory(hurt) == trajectory(clean)
    (event,) = json.loads(hurt.recoveries)
    assert (event["kind"], event["step"], event["cause"], event["ok"]) == ("sandbox", at, "died", True)
    assert event["replayed"] == at - event["checkpoint"] and event["diverged"] == []
    taken = sorted(int(k.rsplit("step-", 1)[1].split(".")[0]) for k in stored_then if k.endswith(".json"))
    assert event["checkpoint"] == (max(taken) if taken else 0)  # the newest durable checkpoint was the one restored
    assert all(step <= at for step in taken)
    assert world.store.list(f"checkpoints/episodes/{LINEAGE.run_id}/{eid}/") == []  # dropped with the episode


@pytest.mark.sandbox
def test_an_action_that_breaks_its_sandbox_again_after_a_restore_is_the_policy_s_error(world, bwrap_backend) -> None:
    task = world.tasks[0]
    first, second = patch_to_actions(task.gold_patch)
    breaker = Action(tool="run", args={"command": "echo BREAK-ME"})
    script = SimpleNamespace(name="breaker", version="1", begin=lambda view, seed: Script([first, breaker, second]))
    rollout = make_rollout(world, BreaksOn(bwrap_backend, "BREAK-ME"), env_retries=0)

    record = rollout.episode(task, script, 0, 1)
    assert (record.status, record.reward) == ("ok", 1.0), record.cause  # the fix still went in around it
    step = record.step_rows[1]
    assert step.action_error and step.observation.startswith("error: this action broke the sandbox twice")
    events = json.loads(record.recoveries)
    assert [(e["kind"], e["step"], e["cause"], e["replayed"]) for e in events] == [
        ("sandbox", 1, "closed", 1),
        ("action", 1, "closed", 1),
    ]

    bounded = make_rollout(world, BreaksOn(bwrap_backend, "BREAK-ME"), env_retries=0, max_recoveries=1)
    record = bounded.episode(task, script, 0, 1)
    assert (record.status, record.reward, record.termination) == ("env_error", None, "error")
    assert [e["kind"] for e in json.loads(record.recoveries)] == ["sandbox"]


@pytest.mark.sandbox
def test_a_policy_exception_stays_a_policy_error(world, bwrap_backend) -> None:
    record = make_rollout(world, bwrap_backend).episode(world.tasks[0], Failing(), 0, 1)
    assert (record.status, record.steps, record.recoveries) == ("policy_error", 2, "[]")


# --- rollback --------------------------------------------------------------------------------------------------
@pytest.mark.sandbox
def test_restore_rolls_the_workspace_back_to_a_named_checkpoint_only_when_enabled(world, bwrap_backend) -> None:
    task = world.tasks[0]
    first, second = patch_to_actions(task.gold_patch)
    actions = [
        Action(tool="create", args={"path": "scratch.txt", "content": "one\n"}),
        first,
        Action(tool="create", args={"path": "scratch.txt", "content": "two\n"}),  # checkpoint step-2 just before
        Action(tool="restore", args={"name": "step-7"}),
        Action(tool="restore", args={"name": "step-0"}),
        Action(tool="view", args={"path": "scratch.txt"}),
        Action(tool="restore", args={"name": "step-2"}),
        Action(tool="view", args={"path": "scratch.txt"}),
        Action(tool="run", args={"command": "rm scratch.txt"}),
        second,
    ]
    script = SimpleNamespace(name="rollback", version="1", begin=lambda view, seed: Script(actions))

    on = make_rollout(world, bwrap_backend, allow_rollback=True, checkpoint_every=2)
    assert on.tools()[-1] == RESTORE_TOOL
    record = on.episode(task, script, 0, 3)
    seen = [s.observation for s in record.step_rows]
    assert seen[3] == "error: no checkpoint named 'step-7'; checkpoints: step-0, step-2"
    assert seen[4].startswith("restored step-0") and seen[5].startswith("error: scratch.txt")  # as at the start
    assert seen[6].startswith("restored step-2") and seen[7].endswith("one")  # the fix's first hunk came back too
    assert (record.status, record.reward) == ("ok", 1.0) and "scratch" not in record.final_diff

    off = make_rollout(world, bwrap_backend)
    assert RESTORE_TOOL not in off.tools()
    record = off.episode(task, script, 0, 3)
    seen = [s.observation for s in record.step_rows]
    assert seen[3].startswith("error: unknown tool 'restore'") and seen[7].endswith("two")
    assert (record.status, record.reward) == ("ok", 1.0)


# --- pause and resume ------------------------------------------------------------------------------------------
@pytest.mark.sandbox
def test_a_paused_batch_resumes_in_another_process_with_every_episode_once_and_unchanged(world, bwrap_backend) -> None:
    rollout, wander = make_rollout(world, bwrap_backend), Wander(world.tasks)
    jobs = batch_jobs(world.tasks, wander)
    trigger_job = jobs[12]  # the first wandering episode: pause the batch as it views notes/answer.txt (action 6)
    batch = ResumableBatch(
        rollout,
        batch_jobs(world.tasks, Trigger(wander, trigger_job.seed, 6, lambda: batch.pause())),
        world.store,
        "pause-test",
        concurrency=2,
    )
    first = batch.run()
    trigger_key = episode_id(LINEAGE, trigger_job)
    paused = sorted(k.rsplit("/", 1)[1].removesuffix(".json") for k in world.store.list("batches/pause-test/paused/"))
    assert not first.complete and trigger_key in paused and set(paused) <= set(first.pending)
    assert len(first.episodes) + len(first.pending) == 18 and 11 <= len(first.episodes) <= 14
    state = EpisodeState.from_json(world.store.get_bytes(f"batches/pause-test/paused/{trigger_key}.json"))
    assert (state.step, state.checkpoint, state.record.attempt) == (7, 6, 1)  # a view changes nothing: no new one

    config = world.root / "resume.json"
    config.write_text(json.dumps({"root": str(world.root), "batch": "pause-test"}))
    done = subprocess.run(
        [sys.executable, __file__, str(config)], capture_output=True, text=True, timeout=600, env=os.environ.copy()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    second = json.loads(done.stdout.strip().splitlines()[-1])
    assert second["pid"] != os.getpid() and second["complete"]
    assert sorted(second["reused"]) == sorted(e.episode_id for e in first.episodes)  # loaded, not run again
    assert sorted(second["resumed"]) == paused
    assert sorted(second["ran"]) == sorted(first.pending)

    keys = {episode_id(LINEAGE, job): job for job in jobs}
    done_keys = [k.rsplit("/", 1)[1].removesuffix(".json") for k in world.store.list("batches/pause-test/done/")]
    assert sorted(done_keys) == sorted(keys) and world.store.list("batches/pause-test/paused/") == []
    records = {
        key: EpisodeRecord.from_dict(json.loads(world.store.get_bytes(f"batches/pause-test/done/{key}.json")))
        for key in keys
    }
    expected = {"gold": (1.0, 3), "noop": (0.0, 1), "wander": (1.0, 11)}  # (reward, steps) of every uninterrupted run
    assert all((r.status, r.reward, r.steps) == ("ok", *expected[r.policy]) for r in records.values())
    assert len({r.final_diff for r in records.values() if r.policy != "noop"} - {""}) == 1
    for key in paused:  # step for step as if never paused
        job = keys[key]
        want = rollout.episode(job.task, wander, job.sample, job.seed)
        got = records[key]
        assert (got.final_diff, trajectory(got)) == (want.final_diff, trajectory(want)), key
        (event,) = json.loads(got.recoveries)
        assert event["kind"] == "resume" and event["diverged"] == []
    (event,) = json.loads(records[trigger_key].recoveries)
    assert (event["step"], event["checkpoint"], event["replayed"]) == (7, 6, 1)


@pytest.mark.sandbox
def test_an_episode_whose_policy_cannot_be_fast_forwarded_restarts_and_says_so(world, bwrap_backend) -> None:
    rollout = make_rollout(world, bwrap_backend)
    task = world.tasks[0]
    job = EpisodeJob(task, Trigger(Fickle(world.tasks), 21, 3, lambda: batch.pause()), 0, 21)
    batch = ResumableBatch(rollout, [job], world.store, "fickle-test")
    assert batch.run().pending == [episode_id(LINEAGE, job)]

    again = EpisodeJob(task, Fickle(world.tasks), 0, 21)
    result = ResumableBatch(rollout, [again], world.store, "fickle-test").resume()
    (record,) = result.episodes
    assert (record.status, record.reward, record.steps) == ("ok", 1.0, 11)
    (event,) = json.loads(record.recoveries)
    assert (event["kind"], event["step"]) == ("restart", 4) and "is not deterministic" in event["message"]


@pytest.mark.sandbox
def test_a_signal_pauses_a_batch_mid_episode_while_its_handler_is_installed(world, bwrap_backend) -> None:
    wander = Wander(world.tasks)
    signal_self = lambda: os.kill(os.getpid(), signal.SIGUSR1)  # noqa: E731
    job = EpisodeJob(world.tasks[0], Trigger(wander, 51, 2, signal_self), 0, 51)
    batch = ResumableBatch(make_rollout(world, bwrap_backend), [job], world.store, "signal-test")
    before = signal.getsignal(signal.SIGUSR1)
    with batch.pause_on(signal.SIGUSR1):
        result = batch.run()
    assert signal.getsignal(signal.SIGUSR1) is before
    key = episode_id(LINEAGE, job)
    assert (result.episodes, result.pending) == ([], [key])
    state = EpisodeState.from_json(world.store.get_bytes(f"batches/signal-test/paused/{key}.json"))
    assert 3 <= state.step < 11  # at a step boundary after the signal, well before the end


class RunnerDied(Exception):
    """What a dead runner leaves in the store (checkpoints, no done or paused record), without killing pytest."""


@pytest.mark.sandbox
def test_an_episode_whose_runner_died_continues_from_its_newest_durable_checkpoint(world, bwrap_backend) -> None:
    rollout, task, wander = make_rollout(world, bwrap_backend), world.tasks[0], Wander(world.tasks)
    job = EpisodeJob(task, wander, 0, 31)
    key = episode_id(LINEAGE, job)

    def die() -> None:
        raise RunnerDied

    with pytest.raises(RunnerDied):  # before the rm of action 8: checkpoints step-3 and step-6 are in the store
        ResumableBatch(rollout, [EpisodeJob(task, Trigger(wander, 31, 8, die), 0, 31)], world.store, "crash-test").run()
    left = world.store.list(f"checkpoints/episodes/{LINEAGE.run_id}/{key}/")
    assert [k.rsplit("/", 1)[1] for k in left] == ["step-3.json", "step-3.tar", "step-6.json", "step-6.tar"]

    result = ResumableBatch(rollout, [job], world.store, "crash-test").resume()
    assert (result.resumed, result.pending) == ([key], [])
    (record,) = result.episodes
    (event,) = json.loads(record.recoveries)
    assert (event["kind"], event["step"], event["checkpoint"], event["replayed"]) == ("resume", 6, 6, 0)
    clean = rollout.episode(task, wander, 0, 31)
    assert (record.reward, record.final_diff, trajectory(record)) == (1.0, clean.final_diff, trajectory(clean))


# --- the resuming process --------------------------------------------------------------------------------------
def resume_main(config_path: str) -> None:
    """Resume a batch of this test in a fresh process; print a one-line JSON summary."""
    config = json.loads(Path(config_path).read_text())
    root = Path(config["root"])
    tasks = [Task.model_validate(t) for t in json.loads((root / "tasks.json").read_text())]
    backend = BwrapBackend(base_image(build=False), state_dir=Path(os.environ["TRIALFORGE_STATE_DIR"]))
    try:
        world = open_world(root, tasks, backend)
        batch = ResumableBatch(
            make_rollout(world, backend), batch_jobs(tasks, Wander(tasks)), world.store, config["batch"], concurrency=2
        )
        result = batch.resume()
    finally:
        backend.close()
    summary = {
        "pid": os.getpid(),
        "complete": result.complete,
        "reused": result.reused,
        "resumed": result.resumed,
        "ran": [e.episode_id for e in result.episodes if e.episode_id not in result.reused],
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    resume_main(sys.argv[1])
