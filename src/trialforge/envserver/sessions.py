"""Live episodes driven from outside: each runs the ordinary agent loop in a thread of its own, and the
client's requests are its policy (no second implementation of sandbox, recovery, grading or records).

At most ``max_live`` episodes run at once (the next reset is refused with Retry-After, not queued); a client silent
for ``idle_timeout_s`` loses its episode (``policy_error``, sandbox released); ``sandbox.episode_timeout_s`` holds
too; a verdict stays readable for ``verdict_ttl_s`` so a retried ``close`` gets the same answer. Every ended episode
is written to the store as the usual episodes/steps Parquet. Why and how: docs/env-server.md, "Recording" and
"Limits and failure".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field

from trialforge.config import EnvServerParams
from trialforge.envserver.protocol import Reset, ResetRequest, StepRequest, StepResult, Verdict
from trialforge.errors import PolicyError
from trialforge.pipeline import store_episodes
from trialforge.rollout.env import Action
from trialforge.rollout.loop import EpisodeJob, Rollout, episode_id
from trialforge.rollout.policies import Decision, EpisodePolicy, TaskView
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import EpisodeRecord
from trialforge.tasks.schema import Task

log = logging.getLogger(__name__)


RETRY_AFTER_S = 1  # what a refused reset is told


class HubError(Exception):
    """A request the hub refuses; ``status`` is the HTTP status it becomes."""

    def __init__(self, status: int, detail: str, retry_after_s: int | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.retry_after_s = retry_after_s  # set: the same request may succeed if tried again after this long


class Full(HubError):
    def __init__(self, live: int, retry_after_s: int) -> None:
        super().__init__(429, f"{live} episodes are live, the most this server runs; retry later", retry_after_s)


_CLOSE = object()  # the client closed the episode: grade the workspace as it is


@dataclass(frozen=True)
class _Abort:
    reason: str  # why the episode ends without the client (it vanished mid-request, the server is stopping)


class _Bridge:
    """Where an episode's thread (asking for actions) meets the server's requests (bringing them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_timeout_s: float) -> None:
        self.loop = loop
        self.idle_timeout_s = idle_timeout_s
        self.observations: asyncio.Queue[str | None] = asyncio.Queue()  # None: the episode has ended
        self.actions: queue.Queue[object] = queue.Queue(maxsize=1)

    def emit(self, observation: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody waits any more
            self.loop.call_soon_threadsafe(self.observations.put_nowait, observation)

    def give(self, item: object) -> None:
        """An action, ``_CLOSE`` or an ``_Abort`` for the waiting episode (a full slot: it already has one)."""
        with contextlib.suppress(queue.Full):
            self.actions.put_nowait(item)

    def act(self, observation: str) -> Decision:
        """The episode thread's side: show the observation, wait for the client's action."""
        self.emit(observation)
        try:
            item = self.actions.get(timeout=self.idle_timeout_s)
        except queue.Empty:
            raise PolicyError(f"the client sent no action for {self.idle_timeout_s:g} s") from None
        if isinstance(item, _Abort):
            raise PolicyError(item.reason)
        if item is _CLOSE:
            return Decision(Action(tool="submit"), info={"via": "close"})
        assert isinstance(item, Action)
        return Decision(item)


@dataclass
class _ClientPolicy:
    """The client as the loop's policy, under the name and version it gave."""

    name: str
    version: str
    bridge: _Bridge

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        return self.bridge


@dataclass
class _Session:
    task: Task
    bridge: _Bridge
    turn: int = 0
    busy: bool = False  # a request is waiting on this episode
    last: tuple[StepRequest, StepResult] | None = None  # the latest step, answered again to a retry
    # Set by the episode's thread when it ends (the record itself goes to the store, not kept here):
    verdict: Verdict | None = None
    final: str = ""  # the last step's observation
    failed: bool = False  # the thread ended without a record (a bug, logged)
    ended_at: float = 0.0
    thread: threading.Thread | None = field(default=None, repr=False)

    def ended(self) -> bool:
        return self.verdict is not None or self.failed

    async def next_observation(self) -> str | None:
        """The next observation, or None once the episode has ended; a request dropped while waiting abandons it
        (what the client saw is unknown, so the conversation cannot go on)."""
        try:
            return await self.bridge.observations.get()
        except asyncio.CancelledError:
            self.bridge.give(_Abort("the client dropped a request mid-episode"))
            raise


class EpisodeHub:
    """The server's episodes: reset, step, close; bounded, reaped, recorded."""

    def __init__(self, rollout: Rollout, tasks: list[Task], store: ObjectStore | None, config: EnvServerParams) -> None:
        # An env_error ends the episode for the client to see; retrying it here would restart a conversation
        # the client believes is under way. Recovery within the episode (restores, replays) stays on.
        self.rollout = dataclasses.replace(rollout, recovery=rollout.recovery.model_copy(update={"env_retries": 0}))
        self.config = config
        self.tasks = {t.task_id: t for t in tasks if t.split in config.splits and t.validation.valid}
        self.store = store
        self.sessions: dict[str, _Session] = {}
        self.running = 0  # episodes whose thread has not ended
        self._counter = itertools.count()
        self._ended: list[EpisodeRecord] = []  # ended, not yet written
        self._parts = itertools.count()
        self._lock = threading.Lock()  # running, _ended
        self._write_lock = threading.Lock()  # one store write at a time, in order

    # --- requests ----------------------------------------------------------------------------------------
    async def reset(self, request: ResetRequest) -> Reset:
        if request.split not in self.config.splits:
            raise HubError(403, f"split {request.split!r} is not served here (served: {list(self.config.splits)})")
        n = next(self._counter)
        seed = n if request.seed is None else request.seed
        task = self._task(request, seed)
        with self._lock:
            if self.running >= self.config.max_live:
                raise Full(self.running, RETRY_AFTER_S)
            self.running += 1
        bridge = _Bridge(asyncio.get_running_loop(), self.config.idle_timeout_s)
        policy = _ClientPolicy(request.policy, request.policy_version, bridge)
        job = EpisodeJob(task, policy, n, seed)
        session = _Session(task, bridge)
        episode = episode_id(self.rollout.lineage, job)
        self.sessions[episode] = session
        session.thread = threading.Thread(target=self._run, args=(session, job), name=f"env-{episode}", daemon=True)
        session.thread.start()
        prompt = await session.next_observation()
        if prompt is None:
            cause = f"{session.verdict.status}: {session.verdict.cause}" if session.verdict else "an internal error"
            raise HubError(
                503, f"episode {episode} could not start ({cause}); reset again", retry_after_s=RETRY_AFTER_S
            )
        return Reset(
            episode_id=episode,
            task_id=task.task_id,
            prompt=prompt,
            tools=self.rollout.tools(),
            max_turns=self.rollout.env_limits.max_turns,
        )

    async def step(self, request: StepRequest) -> StepResult:
        session = self._session(request.episode_id)
        if session.last is not None and request.turn == session.turn - 1:
            if request != session.last[0]:
                raise HubError(409, f"turn {request.turn} of {request.episode_id} was another action")
            return session.last[1]  # a retry whose first answer was lost
        if request.turn is not None and request.turn != session.turn:
            raise HubError(409, f"episode {request.episode_id} is at turn {session.turn}, not {request.turn}")
        self._claim(request.episode_id, session)
        try:
            session.bridge.give(Action(tool=request.tool, args=request.args))
            observation = await session.next_observation()
        finally:
            session.busy = False
        session.turn += 1
        if observation is None:
            self._verdict(request.episode_id, session)  # raises if the episode failed inside the server
            observation = session.final
        result = StepResult(observation=observation, done=session.ended(), turn=session.turn)
        session.last = (request, result)
        return result

    async def close(self, episode_id: str) -> Verdict:
        session = self.sessions.get(episode_id)
        if session is None:
            raise HubError(404, f"no episode {episode_id!r} (never started, or ended over {self._ttl()} ago)")
        if not session.ended():
            self._claim(episode_id, session)
            try:
                session.bridge.give(_CLOSE)
                while await session.next_observation() is not None:  # the submit, then the end
                    pass
            finally:
                session.busy = False
        return self._verdict(episode_id, session)

    # --- bookkeeping -------------------------------------------------------------------------------------
    def forget_old(self) -> None:
        """Forget verdicts older than ``verdict_ttl_s``."""
        cutoff = time.monotonic() - self.config.verdict_ttl_s
        for episode, session in list(self.sessions.items()):
            if session.ended() and session.ended_at < cutoff:
                del self.sessions[episode]

    def flush(self) -> None:
        """Write the ended episodes to the store (episodes and steps, one part each)."""
        with self._write_lock:
            with self._lock:
                ended, self._ended = self._ended, []
            if ended and self.store is not None:
                part = f"env-{next(self._parts):06d}"
                store_episodes(self.store, ended, self.rollout.lineage, part)

    def shutdown(self, grace_s: float = 60.0) -> None:
        """End every live episode (as ``policy_error``: the server went away), wait for them, write them."""
        live = [s for s in self.sessions.values() if not s.ended()]
        for session in live:
            session.bridge.give(_Abort("the environment server shut down"))
        deadline = time.monotonic() + grace_s
        for session in live:
            if session.thread is not None:
                session.thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        self.flush()

    # --- inside ------------------------------------------------------------------------------------------
    def _run(self, session: _Session, job: EpisodeJob) -> None:
        """The episode's thread: the agent loop, to its end, whatever happens."""
        record: EpisodeRecord | None = None
        try:
            record = self.rollout.episode(job.task, job.policy, job.sample, job.seed)
        except Exception:  # a bug must still end the episode for the client waiting on it
            log.exception("episode %d of task %s failed inside the server", job.sample, job.task.task_id)
        with self._lock:
            self.running -= 1
            if record is not None:
                self._ended.append(record)
            flush = len(self._ended) >= self.config.flush_every
        if record is not None:
            session.verdict = verdict(record)
            session.final = record.step_rows[-1].observation if record.step_rows else ""
        session.failed, session.ended_at = record is None, time.monotonic()
        session.bridge.emit(None)
        if flush:
            self.flush()

    def _task(self, request: ResetRequest, seed: int) -> Task:
        if request.task_id is not None:
            task = self.tasks.get(request.task_id)
            if task is None:
                raise HubError(404, f"no task {request.task_id!r} among the {len(self.tasks)} served")
            if task.split != request.split:
                raise HubError(403, f"task {request.task_id!r} is in split {task.split!r}, not {request.split!r}")
            return task
        tier = request.tier
        pool = [t for t in self.tasks.values() if t.split == request.split and tier in (None, _tier(t))]
        if not pool:
            raise HubError(404, f"no served task in split {request.split!r}, tier {tier!r}")
        return random.Random(seed).choice(sorted(pool, key=lambda t: t.task_id))

    def _session(self, episode: str) -> _Session:
        session = self.sessions.get(episode)
        if session is None:
            raise HubError(404, f"no episode {episode!r}")
        return session

    @staticmethod
    def _claim(episode: str, session: _Session) -> None:
        if session.busy:
            raise HubError(409, f"episode {episode} already has a request in flight")
        if session.ended():
            raise HubError(409, f"episode {episode} has ended: close it for its verdict")
        session.busy = True

    @staticmethod
    def _verdict(episode: str, session: _Session) -> Verdict:
        if session.verdict is None:
            raise HubError(500, f"episode {episode} failed inside the server (its log says why); reset again")
        return session.verdict

    def _ttl(self) -> str:
        return f"{self.config.verdict_ttl_s:g} s"


def _tier(task: Task) -> str | None:
    return task.difficulty[-1].tier if task.difficulty else None


def verdict(record: EpisodeRecord) -> Verdict:
    return Verdict(
        episode_id=record.episode_id,
        task_id=record.task_id,
        status=record.status,
        reward=record.reward,  # the loop leaves it None for any status but ok
        cause=record.cause,
        flags=json.loads(record.integrity_flags),
        termination=record.termination,
        steps=record.steps,
    )
