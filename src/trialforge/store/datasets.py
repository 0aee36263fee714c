"""Parquet datasets in an object store, published atomically through manifests.

Layout of dataset NAME partitioned by ``{"run": "r1", "iteration": "0"}``::

    datasets/NAME/run=r1/iteration=0/part-PART.parquet       the rows (zstd)
    datasets/NAME/_manifest/run=r1/iteration=0/PART.json     publishes that part

The part is written first and its manifest entry second, and readers look only at
manifests: a crash between the two leaves an orphan part nobody reads, never half a
batch. The keys depend only on (partition, part), so a retried batch overwrites its
own earlier attempt instead of adding rows. Each put is atomic in both stores.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from trialforge.errors import StoreError
from trialforge.store.objstore import ObjectStore

log = logging.getLogger(__name__)

SCHEMA_VERSION_KEY = b"trialforge.schema_version"
ROOT = "datasets"
MANIFEST_DIR = "_manifest"
Filters = dict[str, str | list[str]]
_READERS = 8  # parallel manifest and part reads: S3 round trips dominate, pyarrow decodes without the GIL
_T = TypeVar("_T")
_R = TypeVar("_R")


# --- names and keys ----------------------------------------------------------------------


def _check_name(what: str, name: str) -> str:
    """Names become path segments; '/', '=' or a leading '.' would change how the layout parses."""
    if not name or "/" in name or "=" in name or "\\" in name or name.startswith("."):
        raise StoreError(f"invalid {what} {name!r}: use a non-empty name without '/', '=', '\\' or a leading '.'")
    return name


def _partition_path(partition: dict[str, str]) -> str:
    for key, value in partition.items():
        _check_name("partition key", key)
        if not isinstance(value, str):
            raise StoreError(f"partition value {key}={value!r} must be a string (partition paths are text)")
        _check_name(f"partition value of {key!r}", value)
    return "".join(f"{k}={v}/" for k, v in partition.items())


def part_key(dataset: str, partition: dict[str, str], part: str) -> str:
    path = _partition_path(partition)
    return f"{ROOT}/{_check_name('dataset', dataset)}/{path}part-{_check_name('part', part)}.parquet"


def manifest_key(dataset: str, partition: dict[str, str], part: str) -> str:
    path = _partition_path(partition)
    return f"{ROOT}/{_check_name('dataset', dataset)}/{MANIFEST_DIR}/{path}{_check_name('part', part)}.json"


def _partition_of(manifest_rel: str) -> dict[str, str]:
    """``run=r1/iteration=0/PART.json`` -> ``{"run": "r1", "iteration": "0"}`` (known before any GET)."""
    return dict(segment.split("=", 1) for segment in manifest_rel.split("/")[:-1])


# --- writing -----------------------------------------------------------------------------


def write_part(
    store: ObjectStore,
    dataset: str,
    table: pa.Table,
    *,
    partition: dict[str, str],
    part: str,
    row_group_size: int = 64_000,
) -> str:
    """Write one part, then publish it; return the part's key. The same (partition, part) always maps to
    the same keys, so calling this again for a retried batch replaces the batch instead of duplicating it."""
    entry = _put_part(store, dataset, table, partition=partition, part=part, row_group_size=row_group_size)
    store.put_bytes(manifest_key(dataset, partition, part), json.dumps(entry).encode())
    log.info("published part", extra={"dataset": dataset, "key": entry["key"], "rows": entry["rows"]})
    return entry["key"]


def _put_part(
    store: ObjectStore,
    dataset: str,
    table: pa.Table,
    *,
    partition: dict[str, str],
    part: str,
    row_group_size: int = 64_000,
) -> dict[str, Any]:
    """The first half of ``write_part``: put the Parquet part, unpublished, and return its manifest entry."""
    key = part_key(dataset, partition, part)
    _check_partition_columns(dataset, table, partition)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=row_group_size)
    data = sink.getvalue().to_pybytes()
    store.put_bytes(key, data)
    version = (table.schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    return {
        "key": key,
        "partition": dict(partition),
        "rows": table.num_rows,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "schema_version": version.decode() if version is not None else None,
        "written_at": datetime.now(UTC).isoformat(),
    }


def _check_partition_columns(dataset: str, table: pa.Table, partition: dict[str, str]) -> None:
    """A column named like a partition key must agree with it, or filters on that key would lie."""
    for key, value in partition.items():
        if key in table.column_names:
            found = pc.unique(pc.cast(table[key], pa.string())).to_pylist()
            if found and found != [value]:
                raise StoreError(
                    f"dataset {dataset!r}: column {key!r} holds {found[:5]} but the part is partitioned {key}={value}; "
                    "write rows of each partition value as their own part"
                )


def write_rows(
    store: ObjectStore,
    dataset: str,
    rows: list[dict[str, Any]],
    schema: pa.Schema,
    *,
    partition: dict[str, str],
    part: str,
) -> str:
    """``write_part`` for records as dicts, typed by the declared ``schema`` (the one place it is declared)."""
    return write_part(store, dataset, _rows_to_table(dataset, rows, schema), partition=partition, part=part)


def _rows_to_table(dataset: str, rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Build column by column so a misfit names its column; undeclared keys are an error, not silently dropped."""
    unknown = sorted({key for row in rows for key in row} - set(schema.names))
    if unknown:
        raise StoreError(f"dataset {dataset!r}: rows have columns {unknown} that its schema does not declare")
    return pa.Table.from_arrays([_column(dataset, f, [row.get(f.name) for row in rows]) for f in schema], schema=schema)


def _column(dataset: str, field: pa.Field, values: list[Any]) -> pa.Array:
    try:
        array = pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise StoreError(
            f"dataset {dataset!r}: column {field.name!r} ({field.type}) rejects a value: {exc}; "
            "fix the record or the schema"
        ) from exc
    if not field.nullable and array.null_count:
        missing = array.null_count
        raise StoreError(f"dataset {dataset!r}: column {field.name!r} is not nullable but {missing} rows lack it")
    return array


# --- reading -----------------------------------------------------------------------------


def list_parts(store: ObjectStore, dataset: str, *, filters: Filters | None = None) -> list[dict[str, Any]]:
    """Manifest entries of the published parts, sorted by key. Only partition keys in ``filters`` prune
    here; a filter on an ordinary column selects rows in ``read_table``."""
    prefix = f"{ROOT}/{_check_name('dataset', dataset)}/{MANIFEST_DIR}/"
    names = [k.removeprefix(prefix) for k in store.list(prefix) if k.endswith(".json")]
    keys = [prefix + name for name in names if _selected(_partition_of(name), filters)]
    return sorted(_map(lambda key: _load_manifest(store, key), keys), key=lambda entry: entry["key"])


def _selected(partition: dict[str, str], filters: Filters | None) -> bool:
    return all(partition[k] in _values(v) for k, v in (filters or {}).items() if k in partition)


def _values(wanted: str | list[str]) -> list[str]:
    return [wanted] if isinstance(wanted, str) else list(wanted)


def _load_manifest(store: ObjectStore, key: str) -> dict[str, Any]:
    try:
        return json.loads(store.get_bytes(key))
    except ValueError as exc:
        raise StoreError(f"manifest {store.uri(key)} is not valid JSON ({exc}); rewrite that part") from exc


def read_table(
    store: ObjectStore, dataset: str, *, filters: Filters | None = None, columns: list[str] | None = None
) -> pa.Table:
    """Rows of the published parts; partition keys come back as string columns.

    ``filters`` maps a partition key or an ordinary column to a value or a list of values, given as
    text and parsed as the column's type. Parts are unified by name (a column missing from one part
    reads as nulls). A dataset with nothing published reads as a table with no rows and no columns.
    """
    entries = list_parts(store, dataset, filters=filters)
    if not entries:
        return pa.table({})
    fs, base = store.arrow_filesystem()
    tables = _map(lambda entry: _read_part(store, fs, base, entry, filters or {}, columns), entries)
    table = _concat(dataset, entries, tables)
    if columns is None:
        return table
    absent = [c for c in columns if c not in table.column_names]
    if absent:
        raise StoreError(f"dataset {dataset!r} has no columns {absent}; it has {table.column_names}")
    return table.select(columns)


def _read_part(
    store: ObjectStore,
    fs: pafs.FileSystem,
    base: str,
    entry: dict[str, Any],
    filters: Filters,
    columns: list[str] | None,
) -> pa.Table:
    partition: dict[str, str] = entry["partition"]
    row_filters = {k: v for k, v in filters.items() if k not in partition}
    try:
        with fs.open_input_file(f"{base}/{entry['key']}") as f:
            parquet = pq.ParquetFile(f)
            names = parquet.schema_arrow.names
            unknown = [k for k in row_filters if k not in names]
            if unknown:
                raise StoreError(
                    f"filter keys {unknown} are neither partition keys nor columns of {store.uri(entry['key'])}"
                )
            wanted = None if columns is None else [n for n in names if n in columns or n in row_filters]
            table = parquet.read(columns=wanted)
    except (OSError, pa.ArrowException) as exc:
        raise StoreError(f"could not read published part {store.uri(entry['key'])}: {exc}") from exc
    table = _filter_rows(table, row_filters, store.uri(entry["key"]))
    for key, value in partition.items():
        if key not in table.column_names:  # a column the rows carry themselves keeps its own type
            table = table.append_column(key, pa.repeat(pa.scalar(value, pa.string()), table.num_rows))
    return table


def _filter_rows(table: pa.Table, filters: Filters, where: str) -> pa.Table:
    """Filter values are text; parse them as the column's type, so "0.0" and "0" both match a float 0."""
    for key, wanted in filters.items():
        column = table[key]
        try:
            values = pa.array(_values(wanted), pa.string()).cast(column.type)
        except pa.ArrowException as exc:
            raise StoreError(f"filter {key}={wanted!r} does not parse as {column.type}, its type in {where}") from exc
        table = table.filter(pc.is_in(column, value_set=values))
    return table


def _concat(dataset: str, entries: list[dict[str, Any]], tables: list[pa.Table]) -> pa.Table:
    try:
        return pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise StoreError(f"dataset {dataset!r}: {_conflict(entries, tables)} ({exc})") from exc


def _conflict(entries: list[dict[str, Any]], tables: list[pa.Table]) -> str:
    """Name the column and the two parts that disagree, so the fix (rewrite one part) is obvious."""
    seen: dict[str, tuple[pa.DataType, str]] = {}
    for entry, table in zip(entries, tables, strict=True):
        for field in table.schema:
            first = seen.setdefault(field.name, (field.type, entry["key"]))
            if first[0] != field.type:
                return (
                    f"column {field.name!r} is {first[0]} in {first[1]} but {field.type} in {entry['key']}; "
                    "rewrite one of those parts with the declared schema"
                )
    return "parts have incompatible schemas"


def read_pandas(
    store: ObjectStore, dataset: str, *, filters: Filters | None = None, columns: list[str] | None = None
) -> pd.DataFrame:
    return read_table(store, dataset, filters=filters, columns=columns).to_pandas()


def _map(fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        return list(pool.map(fn, items))
