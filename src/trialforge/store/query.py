"""Read helpers over the trajectory datasets: episodes and steps, selected by run, policy and versions.

Episodes live in ``datasets/episodes`` and steps in ``datasets/steps``, both partitioned
``run=RUN/iteration=N``; a ``Selection`` prunes by those partitions first and then filters
rows on the lineage columns every episode carries. Everything reads through the manifests,
so only published parts are ever seen; ``published_uris`` hands the same list of parts to
any other Parquet reader (DuckDB, polars, Spark) that would otherwise glob the directory, and
``published_dataset`` hands them over as one Arrow dataset read through the store's own filesystem
(local or S3, with its endpoint and credentials), which DuckDB queries by name
(``duckdb.sql("select ... from episodes")``; tests/test_query_duckdb.py runs docs/storage.md's queries).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from trialforge.errors import StoreError
from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import STEP_SCHEMA

EPISODES = "episodes"
STEPS = "steps"
# Episode columns that travel with each step in ``trajectory_steps``: enough to group, filter and weigh steps.
STEP_CONTEXT = ("task_id", "task_set_version", "policy", "policy_version", "group_id", "status", "reward")
_KEYS = ["run_id", "iteration", "episode_id"]
_ORDER = [*_KEYS, "step"]


@dataclass(frozen=True)
class Selection:
    """Which episodes to read; an empty tuple selects everything on that axis."""

    runs: tuple[str, ...] = ()
    iterations: tuple[int, ...] = ()
    policies: tuple[str, ...] = ()
    policy_versions: tuple[str, ...] = ()
    task_set_versions: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()

    def partition_filters(self) -> datasets.Filters:
        """The filters both datasets share: their partition keys, which prune whole parts unread."""
        filters: datasets.Filters = {}
        if self.runs:
            filters["run"] = list(self.runs)
        if self.iterations:
            filters["iteration"] = [str(i) for i in self.iterations]
        return filters

    def episode_filters(self) -> datasets.Filters:
        columns = {
            "policy": self.policies,
            "policy_version": self.policy_versions,
            "task_set_version": self.task_set_versions,
            "status": self.statuses,
        }
        return self.partition_filters() | {name: list(values) for name, values in columns.items() if values}


ALL = Selection()


def episodes(store: ObjectStore, selection: Selection = ALL, *, columns: list[str] | None = None) -> pa.Table:
    """Episode rows of the selection (all of ``EPISODE_SCHEMA``'s columns unless ``columns`` names some)."""
    return datasets.read_table(store, EPISODES, filters=selection.episode_filters(), columns=columns)


def steps(store: ObjectStore, selection: Selection = ALL, *, columns: list[str] | None = None) -> pa.Table:
    """Step rows of the selected episodes, ordered by episode and step."""
    chosen = episodes(store, selection, columns=["episode_id"])
    if chosen.num_rows == 0:
        return pa.table({})
    table = datasets.read_table(store, STEPS, filters=selection.partition_filters(), columns=STEP_SCHEMA.names)
    if table.num_rows:
        table = table.filter(pc.is_in(table["episode_id"], value_set=chosen["episode_id"]))
        table = table.sort_by([(key, "ascending") for key in _ORDER])
    return table if columns is None else table.select(columns)


def trajectory_steps(
    store: ObjectStore, selection: Selection = ALL, *, context: tuple[str, ...] = STEP_CONTEXT
) -> pa.Table:
    """Steps joined to their episodes: every step row gains the episode's ``context`` columns."""
    step_rows = steps(store, selection)
    if step_rows.num_rows == 0:
        return step_rows
    episode_rows = episodes(store, selection, columns=[*_KEYS, *context])
    joined = step_rows.join(episode_rows, keys=_KEYS, join_type="inner")
    return joined.sort_by([(key, "ascending") for key in _ORDER])


def episodes_pandas(
    store: ObjectStore, selection: Selection = ALL, *, columns: list[str] | None = None
) -> pd.DataFrame:
    return episodes(store, selection, columns=columns).to_pandas()


def trajectory_steps_pandas(store: ObjectStore, selection: Selection = ALL) -> pd.DataFrame:
    return trajectory_steps(store, selection).to_pandas()


def published_uris(store: ObjectStore, dataset: str, *, filters: datasets.Filters | None = None) -> list[str]:
    """URIs of the published parts of ``dataset``: give this list to a reader that does not know manifests."""
    return [store.uri(entry["key"]) for entry in datasets.list_parts(store, dataset, filters=filters)]


def published_dataset(store: ObjectStore, dataset: str, *, filters: datasets.Filters | None = None) -> pads.Dataset:
    """The published parts of ``dataset`` as one lazy Arrow dataset, through the store's filesystem (S3 included).

    Columns as ``datasets.read_table`` has them: the first part's, and each partition key the rows do not
    carry as a string column. Nothing is read until a query scans it; a query's filters reach the scan.
    Nothing published is a ``StoreError``: a dataset needs one part to have columns at all.
    """
    entries = datasets.list_parts(store, dataset, filters=filters)
    fs, base = store.arrow_filesystem()
    paths = [f"{base}/{entry['key']}" for entry in entries]
    if not paths:
        raise StoreError(f"{store.url}: dataset {dataset!r} has no published parts (filters: {filters or 'none'})")
    carried = pads.dataset(paths[0], filesystem=fs, format="parquet").schema.names
    keys = [key for key in dict.fromkeys(k for entry in entries for k in entry["partition"]) if key not in carried]
    hive = pads.partitioning(pa.schema([(key, pa.string()) for key in keys]), flavor="hive")
    root = f"{base}/{datasets.ROOT}/{dataset}"
    return pads.dataset(paths, filesystem=fs, format="parquet", partitioning=hive, partition_base_dir=root)
