"""Where a task's episodes start: its base snapshot after the rollout's setup command, made once and shared.

Every episode of a task (the G samples of a GRPO group, and those of other policies) forks this one
post-setup tree, so all of them start from the same state, and the setup (installing dependencies,
compiling, warming caches) runs once per task instead of once per episode. The tree is cached on disk,
keyed by the snapshot, the image digest and the command: a later batch, or a process continuing an
episode, finds it instead of running the setup again. A task whose environment builds extension modules
has them built there too (``tasks.extbuild``). Without either the start is the base snapshot itself.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from trialforge.errors import SandboxError
from trialforge.sandbox.pool import SandboxPool
from trialforge.tasks.extbuild import run_build
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore

log = logging.getLogger(__name__)

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


@dataclass(frozen=True)
class Setup:
    command: str = ""  # shell command run in /work before a task's episodes fork; "" runs nothing
    timeout_s: float = 600.0


def start_tree(
    task: Task, setup: Setup, snapshots: SnapshotStore, sandboxes: SandboxPool, image: str, image_digest: str
) -> Path:
    """The directory every episode of ``task`` starts from (read-only by convention)."""
    base = snapshots.materialize(task.snapshot)
    build = task.env.build if task.env is not None else None
    if not setup.command and build is None:
        return base
    made = f"{task.snapshot}\0{image_digest}\0{setup.command}\0{build.model_dump_json() if build else ''}"
    key = hashlib.sha256(made.encode()).hexdigest()[:24]
    dest = snapshots.cache_dir.with_name("starts") / key
    with _lock(key):  # the group's other episodes wait for the first one's setup instead of repeating it
        if dest.is_dir():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".setup-"))
        try:
            _run_setup(task, setup, base, tmp / "work", sandboxes, image)
            os.rename(tmp / "work", dest)  # another process may have won the race: theirs starts the same way
        except OSError:
            if not dest.is_dir():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _run_setup(task: Task, setup: Setup, base: Path, out: Path, sandboxes: SandboxPool, image: str) -> None:
    """The setup command, then the build of the repository's own extensions (``tasks.extbuild``): episodes start
    with them compiled, as validation ran the tests."""
    seconds = 0.0
    with sandboxes.sandbox(image, base, labels={"setup": task.task_id}) as sandbox:
        if setup.command:
            result = sandbox.exec(["bash", "-c", setup.command], timeout=setup.timeout_s)
            seconds += result.duration_s
            if not result.ok:
                status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
                tail = (result.stdout + result.stderr)[-2000:]
                what = f"setup of task {task.task_id} failed ({status}): {setup.command}"
                raise SandboxError(f"{what}\n{tail}", cause="setup")
        if task.env is not None and task.env.build is not None:
            built = run_build(sandbox, task.env.build)
            seconds += built.seconds
            if not built.ok:  # validation built this very tree: the image or the machine changed since
                raise SandboxError(f"the extensions of task {task.task_id} did not build: {built.why}", cause="setup")
        sandbox.export_workspace(out)
    log.info("task set up", extra={"task": task.task_id, "seconds": round(seconds, 3)})


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())
