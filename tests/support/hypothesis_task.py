"""A task whose repository's suite uses hypothesis, validated for real in its own image (hypothesis installed from
the loopback wheel index of the test tools), with its grader: what tests/test_hypothesis_plugin.py and the red team
round on hypothesis (tests/test_redteam_hypothesis.py) grade diffs against."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support.redteam_repo import write_tree
from trialforge.sandbox.base import Backend, Limits
from trialforge.sandbox.images import BASE_NAME, ENV_REPO
from trialforge.store.objstore import open_store
from trialforge.tasks.envimages import provide_images, task_image
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader


@contextmanager
def hypothesis_task(
    root: Path, index: str, backend: Backend, trees: dict[str, dict[str, str]], task_id: str, statement: str
) -> Iterator[tuple[Task, Grader, Path]]:
    """``trees``: the files of ``base`` (the repository), and those ``hidden`` (the fail-to-pass tests) and ``fixed``
    (the gold fix) write over it. Yields the validated task, its grader and the base tree; the image goes after."""
    base = write_tree(root / "base", trees["base"])
    for name in ("hidden", "fixed"):
        shutil.copytree(base, root / name)
        write_tree(root / name, trees[name])
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    task = Task(
        task_id=task_id, source=Source(kind="git", ref=f"calc@{task_id}"), repo="calc",
        snapshot=snapshots.put(base), problem_statement=statement,
        gold_patch=diff_trees(base, root / "fixed"), test_patch=diff_trees(base, root / "hidden"),
    )  # fmt: skip
    (provided,), funnel, built = provide_images(
        [task], snapshots, {"calc": {"pip_args": ["--no-index", "--find-links", index]}}
    )
    try:
        assert funnel.kept == 1, funnel.details
        image = task_image(provided, backend, BASE_NAME).name
        assert image.startswith(ENV_REPO + ":")
        validated = validate_task(provided, backend, image, snapshots, Limits(), ValidateConfig(runs=1))
        yield validated, Grader(backend, BASE_NAME, "", snapshots, Limits(), test_timeout_s=120), base
    finally:
        for one in built:
            if one.image.name.startswith(ENV_REPO):
                shutil.rmtree(one.image.rootfs.parent, ignore_errors=True)
