"""Pause a batch of episodes and resume it later, in this process or in another one.

``ResumableBatch(rollout, jobs, store, batch_id)`` runs its jobs concurrently and keeps its state in ``store`` under
``batches/<batch_id>/``: ``manifest.json`` (the job keys, written once), ``done/<key>.json``, ``paused/<key>.json``.
A job's key is its episode id. ``pause()`` makes running episodes checkpoint and stop at their next step boundary;
``run()``, in any process, continues from what the store holds, so every job ends exactly once. docs/rollouts.md,
"Recovery, pause and resume".
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from trialforge.errors import ConfigError
from trialforge.rollout.checkpoints import EpisodeState, latest_state
from trialforge.rollout.loop import EpisodeJob, Rollout, episode_id
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import EpisodeRecord

log = logging.getLogger(__name__)

PREFIX = "batches"


@dataclass
class BatchResult:
    episodes: list[EpisodeRecord]  # every finished episode, in job order (loaded or run now)
    pending: list[str] = field(default_factory=list)  # keys of the jobs paused or not started
    reused: list[str] = field(default_factory=list)  # keys of the episodes finished earlier: loaded, not run again
    resumed: list[str] = field(default_factory=list)  # keys of the jobs this run continued from a saved state

    @property
    def complete(self) -> bool:
        return not self.pending


class ResumableBatch:
    """A batch of episodes that can stop at step boundaries and continue in any process (one run per object)."""

    def __init__(
        self, rollout: Rollout, jobs: list[EpisodeJob], store: ObjectStore, batch_id: str, *, concurrency: int = 1
    ) -> None:
        self.rollout = replace(rollout, store=store)
        self.jobs = {episode_id(rollout.lineage, job): job for job in jobs}
        if len(self.jobs) != len(jobs):
            raise ConfigError(f"batch {batch_id!r} lists the same episode twice: each job needs its own sample or seed")
        self.store = store
        self.batch_id = batch_id
        self.concurrency = max(concurrency, 1)
        self._stop = threading.Event()

    def pause(self) -> None:
        """Stop at the next step boundaries (thread-safe; returns at once, ``run`` returns when all stopped)."""
        self._stop.set()

    @contextmanager
    def pause_on(self, *signals: signal.Signals) -> Iterator[None]:
        """Pause when one of ``signals`` (default SIGTERM and SIGINT) arrives; main thread only."""

        def handler(signum: int, frame: object) -> None:
            self.pause()

        previous = {sig: signal.signal(sig, handler) for sig in signals or (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    def resume(self) -> BatchResult:
        """Continue a batch started before (here or in another process); refuse a batch id never started."""
        if not self.store.exists(self._key("manifest.json")):
            raise ConfigError(f"no batch {self.batch_id!r} in {self.store.url}: nothing to resume (start it with run)")
        return self.run()

    def run(self) -> BatchResult:
        """Run the jobs that have not finished, ``concurrency`` at a time, until done or paused."""
        self._check_manifest()
        finished = {key: self._load_done(key) for key in self._listed("done")}
        todo = [key for key in self.jobs if key not in finished]
        resumed: list[str] = []
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            outcomes = dict(zip(todo, pool.map(lambda key: self._one(key, resumed), todo), strict=True))
        episodes = [finished.get(key) or outcomes.get(key) for key in self.jobs]
        result = BatchResult(
            episodes=[e for e in episodes if e is not None],
            pending=[key for key, e in zip(self.jobs, episodes, strict=True) if e is None],
            reused=[key for key in self.jobs if key in finished],
            resumed=sorted(resumed),
        )
        log.info(
            "batch run ended",
            extra={"batch": self.batch_id, "done": len(result.episodes), "pending": len(result.pending)},
        )
        return result

    def _one(self, key: str, resumed: list[str]) -> EpisodeRecord | None:
        if self._stop.is_set():
            return None
        state = self._saved_state(key)
        if state is not None:
            resumed.append(key)
        outcome = self.rollout.run(self.jobs[key], state, self._stop)
        if isinstance(outcome, EpisodeState):
            self.store.put_bytes(self._key(f"paused/{key}.json"), outcome.to_json())
            return None
        self.store.put_bytes(self._key(f"done/{key}.json"), json.dumps(outcome.to_dict(), sort_keys=True).encode())
        return outcome

    def _saved_state(self, key: str) -> EpisodeState | None:
        """A paused state (consumed here), else the newest checkpoint of a process that died, else None."""
        paused = self._key(f"paused/{key}.json")
        if self.store.exists(paused):
            state = EpisodeState.from_json(self.store.get_bytes(paused))
            self.store.delete(paused)
            return state
        return latest_state(self.store, self.rollout.lineage.run_id, key)

    def _check_manifest(self) -> None:
        key = self._key("manifest.json")
        keys = list(self.jobs)
        if not self.store.exists(key):
            self.store.put_bytes(key, json.dumps({"jobs": keys}).encode())
            return
        planned = json.loads(self.store.get_bytes(key))["jobs"]
        if planned != keys:
            raise ConfigError(
                f"batch {self.batch_id!r} in {self.store.url} was started with other jobs ({len(planned)} planned, "
                f"{len(set(planned) & set(keys))} of them given now): resume it with the same tasks, policies, "
                "samples, seeds and lineage, or use a new batch id"
            )

    def _load_done(self, key: str) -> EpisodeRecord:
        return EpisodeRecord.from_dict(json.loads(self.store.get_bytes(self._key(f"done/{key}.json"))))

    def _listed(self, kind: str) -> list[str]:
        prefix = self._key(f"{kind}/")
        return [k.removeprefix(prefix).removesuffix(".json") for k in self.store.list(prefix)]

    def _key(self, name: str) -> str:
        return f"{PREFIX}/{self.batch_id}/{name}"
