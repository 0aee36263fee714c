"""docs/storage.md's DuckDB queries, run as the page prints them, on stores written by trialforge's own writer.

The code blocks of the page's DuckDB section are read from the page itself and run with only its placeholders
(the store path, the bucket, the endpoint and the keys) replaced, so the page cannot drift from what works.
The stores hold the hand-built runs r1 and r2 (tests/fixtures/observe/runs.py) and one unpublished part: an
episode of run r9 whose writer "died" before its manifest entry (gold, ok, reward 0.0). Over r1 and r2, ok
episodes: gold e01 e02 e05 f01 f02 g01, all reward 1.0; repair e03 e04 f03 f04 g02 g03, rewards 1 0 1 1 1 0.
"""

from __future__ import annotations

import ast
import re
from typing import Any
from urllib.parse import urlsplit

import duckdb
import pytest
from conftest import REPO_ROOT
from fixtures.observe.runs import episode_row, write_r1, write_r2

from trialforge.errors import StoreError
from trialforge.store import datasets, query
from trialforge.store.objstore import ObjectStore, open_store
from trialforge.store.records import EPISODE_SCHEMA

DOC = REPO_ROOT / "docs" / "storage.md"
DOC_ROOT = "/abs/path/.trialforge/store"
PUBLISHED = {"gold": (6, 1.0), "repair": (6, 4 / 6)}  # ok episodes, mean reward
WITH_ORPHAN = {"gold": (7, 6 / 7), "repair": (6, 4 / 6)}
STEP_CALLS = [  # steps of r1 by their episode's policy: e01 run view submit, f01 run; e03 replace submit, e07 ...
    ("gold", "run", 2), ("gold", "submit", 1), ("gold", "view", 1),
    ("repair", "no_such_tool", 1), ("repair", "replace", 1), ("repair", "run", 1), ("repair", "submit", 1),
]  # fmt: skip


def doc_block(language: str, containing: str) -> str:
    """The one fenced ``language`` block of the page's DuckDB section that contains ``containing``."""
    text = DOC.read_text()
    section = text[text.index("## Reading with DuckDB") : text.index("## Exports for verl and TRL")]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    found = [code for lang, code in blocks if lang == language and containing in code]
    assert len(found) == 1, f"{len(found)} {language} blocks of {DOC} contain {containing!r}"
    return found[0]


def run_python(code: str, **names: Any) -> list[list[tuple]]:
    """Run a block as if pasted into Python, with ``names`` defined; each top-level expression's rows."""
    namespace: dict[str, Any] = dict(names)
    results = []
    for node in ast.parse(code).body:
        if isinstance(node, ast.Expr):
            results.append(eval(compile(ast.Expression(node.value), str(DOC), "eval"), namespace).fetchall())
        else:
            exec(compile(ast.Module([node], []), str(DOC), "exec"), namespace)
    return results


def run_sql(code: str) -> list[tuple]:
    """Run a block's statements in one fresh DuckDB connection; the last one's rows."""
    con = duckdb.connect()
    *setup, last = [statement for statement in code.split(";") if statement.strip()]
    for statement in setup:
        con.execute(statement)
    return con.sql(last).fetchall()


def means(rows: list[tuple]) -> dict[str, float]:
    """policy -> mean reward, the last column of each row."""
    return {row[0]: row[-1] for row in rows}


def expected_means(table: dict[str, tuple[int, float]]) -> dict[str, Any]:
    return pytest.approx({policy: mean for policy, (_, mean) in table.items()})


def write_runs(store: ObjectStore) -> None:
    write_r1(store)
    write_r2(store)
    orphan = episode_row("r9", 0, ("o01", "t1", "gold", "ok", "", "submitted", 0.0, 1, 0, 0, 0.1, 1.0, 1.0))
    partition = {"run": "r9", "iteration": "0"}
    datasets.write_rows(store, "episodes", [orphan], EPISODE_SCHEMA, partition=partition, part="died")
    store.delete(datasets.manifest_key("episodes", partition, "died"))  # the writer died before publishing it


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> ObjectStore:
    store = open_store(f"file://{tmp_path_factory.mktemp('duckdb') / 'store'}")
    write_runs(store)
    return store


@pytest.fixture
def s3(s3_store: ObjectStore, monkeypatch) -> ObjectStore:
    """A store on the moto server, whose endpoint reaches the page's code through AWS_ENDPOINT_URL as documented."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_store.endpoint)  # type: ignore[attr-defined]
    write_runs(s3_store)
    return s3_store


def local_root(store: ObjectStore) -> str:
    return urlsplit(store.url).path


@pytest.mark.pure
def test_the_glob_queries_read_every_part_published_or_not(local):
    code = doc_block("python", "part-*.parquet', hive_partitioning = true)").replace(DOC_ROOT, local_root(local))
    per_policy, step_calls = run_python(code)
    assert [(policy, episodes) for policy, episodes, _ in per_policy] == [("gold", 7), ("repair", 6)]
    assert means(per_policy) == expected_means(WITH_ORPHAN)
    assert step_calls == STEP_CALLS


@pytest.mark.pure
def test_the_manifest_query_in_sql_reads_only_published_parts(local):
    rows = run_sql(doc_block("sql", "getvariable('published')").replace(DOC_ROOT, local_root(local)))
    assert means(rows) == expected_means(PUBLISHED)


@pytest.mark.pure
def test_published_uris_read_by_duckdb_are_the_published_parts(local):
    (rows,) = run_python(doc_block("python", "query.published_uris(store"), store=local, query=query, duckdb=duckdb)
    assert means(rows) == expected_means(PUBLISHED)


@pytest.mark.parametrize(
    "where", [pytest.param("local", marks=pytest.mark.pure), pytest.param("s3", marks=pytest.mark.services)]
)
def test_published_datasets_are_queried_by_name_on_a_local_store_and_on_s3(where, request):
    store = request.getfixturevalue(where)
    code = doc_block("python", "query.published_dataset(store").replace('"s3://bucket/prefix"', repr(store.url))
    (rows,) = run_python(code)
    # ok episodes only: e01 run view submit, f01 run (gold); e03 replace submit (repair); all rewarded 1.0
    assert rows == [
        ("gold", "run", 2, 1.0), ("gold", "submit", 1, 1.0), ("gold", "view", 1, 1.0),
        ("repair", "replace", 1, 1.0), ("repair", "submit", 1, 1.0),
    ]  # fmt: skip
    episodes = query.published_dataset(store, "episodes", filters={"run": "r2"})  # noqa: F841 (DuckDB reads it by name)
    assert duckdb.sql("select count(*), min(run) from episodes").fetchall() == [(4, "r2")]
    with pytest.raises(StoreError, match="dataset 'verl' has no published parts"):
        query.published_dataset(store, "verl")
