"""Episode checkpoints: the workspace and the conversation at a step boundary.

A checkpoint named ``step-N`` is the episode *before* its action N: ``/work`` as a deterministic tar (``pack_tree``)
and the episode's record with steps 0..N-1; ``step-0`` is the task's base snapshot and costs nothing. In a store
they are ``checkpoints/episodes/<run>/<episode>/step-<N>.tar`` then ``step-<N>.json``, the JSON written last: it
names a complete checkpoint. What they serve, and why a tar plus replay is exact: docs/rollouts.md, "Recovery,
pause and resume".
"""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from trialforge.errors import StoreError
from trialforge.rollout.env import Action
from trialforge.scratch import scratch_dir
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import EpisodeRecord
from trialforge.tasks.snapshots import pack_tree

log = logging.getLogger(__name__)

PREFIX = "checkpoints/episodes"

# ``run`` commands that can destroy work or break the sandbox: a checkpoint is taken before them. A cheap lexical
# heuristic on the command's words (false positives cost one checkpoint; it is not a security boundary).
RISKY_COMMANDS = (
    "rm", "rmdir", "mv", "kill", "pkill", "killall", "pip", "pip3", "chmod", "chown", "dd", "truncate", "shred", "git",
)  # fmt: skip
_RISKY = re.compile(r"(?<![\w./-])(?:" + "|".join(RISKY_COMMANDS) + r"|-delete)(?![\w.-])")

RESTORE = "restore"
RESTORE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": RESTORE,
        "description": (
            "Put the repository back as it was at a checkpoint, dropping every change made after it. "
            "'step-0' is the repository you started from; 'step-N' is how it was just before your action N "
            "(checkpoints are taken every few actions and before risky commands; a wrong name lists them)."
        ),
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
}


def is_risky(action: Action) -> bool:
    """A ``run`` whose command names rm, mv, kill, pip, chmod, git... (``RISKY_COMMANDS``)."""
    return action.tool == "run" and bool(_RISKY.search(str(action.args.get("command", ""))))


def checkpoint_name(step: int) -> str:
    return f"step-{step}"


def parse_checkpoint_name(name: object) -> int | None:
    match = re.fullmatch(r"step-(\d+)", name) if isinstance(name, str) else None
    return int(match.group(1)) if match else None


def episode_prefix(run_id: str, episode_id: str) -> str:
    return f"{PREFIX}/{run_id}/{episode_id}/"


@dataclass(frozen=True)
class Recovery:
    """One entry of ``EpisodeRecord.recoveries``.

    kind: ``sandbox`` (the sandbox failed; a new one was restored from ``checkpoint`` and ``replayed`` actions ran
    again), ``action`` (the same action failed the sandbox again right after a restore: it is the action's doing, so
    the policy sees it as an error observation and the workspace is restored to before it), ``resume`` (a paused or
    crashed episode continued in a new sandbox after the policy was fast-forwarded over ``step`` recorded
    observations), ``restart`` (a saved episode could not be continued, e.g. the policy is not deterministic: it
    started again from scratch). ``ok`` is false when the restore itself failed (it still counts toward the bound).
    """

    kind: Literal["sandbox", "action", "resume", "restart"]
    step: int  # the step that failed (or where the episode was resumed)
    cause: str  # SandboxError.cause, or why a saved episode was not continued
    message: str
    checkpoint: int | None = None
    replayed: int = 0
    diverged: list[int] = field(default_factory=list)  # replayed steps whose observation differed from the recording
    seconds: float = 0.0
    ok: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EpisodeState:
    """What an episode needs to continue elsewhere: its record so far and the checkpoint to restore.

    ``record.step_rows`` holds the steps taken; ``checkpoint`` (at most their number) is the workspace to
    restore, after which the steps from ``checkpoint`` on are executed again.
    """

    record: EpisodeRecord
    checkpoint: int
    checkpoints: list[int]  # every checkpoint taken so far (the names ``restore`` accepts)
    elapsed_s: float  # time this attempt has run so far

    @property
    def step(self) -> int:
        return len(self.record.step_rows)

    def to_json(self) -> bytes:
        data = {
            "record": self.record.to_dict(),
            "checkpoint": self.checkpoint,
            "checkpoints": self.checkpoints,
            "elapsed_s": self.elapsed_s,
        }
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> EpisodeState:
        raw = json.loads(data)
        return cls(EpisodeRecord.from_dict(raw["record"]), raw["checkpoint"], raw["checkpoints"], raw["elapsed_s"])


class Checkpoints:
    """One episode's checkpoints: kept in memory, and in the store when there is one.

    Only the latest tree stays in memory unless ``keep_all`` (rollback may name any); an older one, or one
    taken by another process, is read back from the store.
    """

    def __init__(self, base: Path, store: ObjectStore | None, prefix: str, *, keep_all: bool) -> None:
        self.base = base
        self.store = store
        self.prefix = prefix
        self.keep_all = keep_all
        self.steps: list[int] = [0]
        self._trees: dict[int, bytes] = {}

    @property
    def latest(self) -> int:
        return self.steps[-1]

    def names(self) -> list[str]:
        return [checkpoint_name(s) for s in self.steps]

    def adopt(self, steps: list[int]) -> None:
        """Continue an episode saved by another run: its checkpoints are in the store."""
        self.steps = sorted(set(steps) | {0})

    def state(self, record: EpisodeRecord, elapsed_s: float) -> EpisodeState:
        """The episode as it stands, to continue from the latest checkpoint."""
        return EpisodeState(record, self.latest, list(self.steps), elapsed_s)

    def take(self, export: Callable[[Path], None], record: EpisodeRecord, elapsed_s: float) -> None:
        """Checkpoint the boundary before step ``len(record.step_rows)``: the workspace (``export`` copies the
        sandbox's /work into a directory) and the episode.

        A store that refuses the checkpoint costs its durability, not the episode: it stays in memory for
        recovery in this process, and the failure is logged.
        """
        step = len(record.step_rows)
        with scratch_dir("ckpt") as tmp:
            tree = Path(tmp) / "work"
            export(tree)
            for git in sorted(tree.rglob(".git"), reverse=True):  # git history never leaves (nor enters) a sandbox
                if git.is_dir() and not git.is_symlink():
                    shutil.rmtree(git)
                else:
                    git.unlink()
            data = pack_tree(tree)
        if step != self.latest:
            self.steps.append(step)
        self._remember(step, data)
        if self.store is not None:
            try:
                self.store.put_bytes(self._key(step, "tar"), data)
                self.store.put_bytes(self._key(step, "json"), self.state(record, elapsed_s).to_json())
            except StoreError as exc:
                log.warning("checkpoint not stored", extra={"key": self._key(step, "tar"), "error": str(exc)})

    @contextmanager
    def tree(self, step: int) -> Iterator[Path]:
        """The workspace of checkpoint ``step`` as a directory (read-only by convention)."""
        if step == 0:
            yield self.base
            return
        data = self._trees.get(step)
        if data is None:
            if self.store is None:
                raise KeyError(f"checkpoint {checkpoint_name(step)} is neither in memory nor in a store")
            data = self.store.get_bytes(self._key(step, "tar"))
            self._remember(step, data)
        with scratch_dir("restore") as tmp:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(tmp, filter="tar")  # our own tar: symlinks the agent made may point anywhere
            yield Path(tmp)

    def clear(self) -> None:
        """Forget every checkpoint but ``step-0``, in the store too (JSONs first: none may name a missing tar)."""
        self.steps = [0]
        self._trees.clear()
        if self.store is None:
            return
        try:
            for key in sorted(self.store.list(self.prefix), key=lambda k: not k.endswith(".json")):
                self.store.delete(key)
        except StoreError as exc:  # a left-over is still a consistent checkpoint of an earlier attempt
            log.warning("checkpoints not cleared", extra={"prefix": self.prefix, "error": str(exc)})

    def _remember(self, step: int, data: bytes) -> None:
        if self.keep_all:
            self._trees[step] = data
        elif step == self.latest:
            self._trees = {step: data}

    def _key(self, step: int, ext: str) -> str:
        return f"{self.prefix}{checkpoint_name(step)}.{ext}"


def latest_state(store: ObjectStore, run_id: str, episode_id: str) -> EpisodeState | None:
    """The state of the newest durable checkpoint of an episode (what a crashed process left), if any."""
    prefix = episode_prefix(run_id, episode_id)
    names = (key.removeprefix(prefix).removesuffix(".json") for key in store.list(prefix) if key.endswith(".json"))
    steps = [step for step in map(parse_checkpoint_name, names) if step is not None]
    if not steps:
        return None
    return EpisodeState.from_json(store.get_bytes(f"{prefix}{checkpoint_name(max(steps))}.json"))
