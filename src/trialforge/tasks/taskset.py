"""Task sets as Parquet: one row per task, nested fields as JSON; the version is the content hash. A file
(``write_tasks``/``read_tasks``), or a dataset of the object store the flows hand each other (``publish``/
``read_published``: partition ``task_set=VERSION``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from trialforge.errors import ConfigError, TaskError
from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore
from trialforge.tasks.schema import Task, task_set_version

INGESTED = "ingested"  # task sets as the ingest flow found them
TASKS = "tasks"  # curated task sets, what a run trains on


def to_table(tasks: list[Task]) -> pa.Table:
    rows = [t.to_row() for t in tasks]
    if not rows:
        return pa.table({"task_id": pa.array([], pa.string())})
    table = pa.Table.from_pylist(rows)
    return table.replace_schema_metadata({b"trialforge.task_set_version": task_set_version(tasks).encode()})


def from_table(table: pa.Table) -> list[Task]:
    return [Task.from_row(row) for row in table.to_pylist() if row.get("task_id")]


def write_tasks(path: Path, tasks: list[Task]) -> str:
    """Write atomically (a reader never sees half a file); return the task-set version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        pq.write_table(to_table(tasks), tmp, compression="zstd")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return task_set_version(tasks)


def read_tasks(path: Path) -> list[Task]:
    """The tasks of a task set file; a TaskError that says why for a missing file or one that holds no task set."""
    if not path.exists():
        raise TaskError(f"no task set at {path}: run the step that writes it first")
    try:
        return from_table(pq.read_table(path))
    except (OSError, pa.ArrowException, KeyError, TypeError, ValueError) as exc:  # pydantic's errors are ValueErrors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskError(f"{path} is not a task set (the Parquet `trialforge ingest` writes): {first}") from exc


def publish(store: ObjectStore, dataset: str, tasks: list[Task]) -> str:
    """Store a task set in ``dataset`` (partition ``task_set=VERSION``) for the next flow; return the version."""
    version = task_set_version(tasks)
    datasets.write_part(store, dataset, to_table(tasks), partition={"task_set": version}, part="all")
    return version


def read_published(store: ObjectStore, dataset: str, version: str | None = None) -> tuple[str, list[Task]]:
    """A task set of ``dataset`` by version; ``None`` picks the one published last."""
    entries = datasets.list_parts(store, dataset, filters={"task_set": version} if version else None)
    if not entries:
        which = f"version {version}" if version else "any task set"
        raise ConfigError(f"{store.uri(f'datasets/{dataset}')} holds {which}: run the flow that publishes it first")
    version = version or max(entries, key=lambda e: e["written_at"])["partition"]["task_set"]
    table = datasets.read_table(store, dataset, filters={"task_set": version})
    return version, from_table(table.drop_columns(["task_set"]))  # the partition key is not a task field
