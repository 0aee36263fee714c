"""The object store and Parquet datasets, on file:// and on a real S3 server (moto over HTTP)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.s3_server import MotoServer, create_bucket

from trialforge.errors import StoreError
from trialforge.store import datasets
from trialforge.store.objstore import TMP_PREFIX, ObjectStore, open_store

TABLE = pa.table(
    {
        "episode_id": ["e1", "e2", "e3"],
        "policy": ["gold", "noop", "gold"],
        "reward": [1.0, 0.0, 1.0],
    }
)
RUN = {"run": "r1", "iteration": "0"}


@pytest.fixture
def file_store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path / 'store'}")


@pytest.fixture(params=[pytest.param("file", marks=pytest.mark.pure), pytest.param("s3", marks=pytest.mark.services)])
def store(request: pytest.FixtureRequest) -> ObjectStore:
    """The same behaviour is owed by both backends."""
    return request.getfixturevalue(f"{request.param}_store")


def rows(store: ObjectStore, dataset: str = "episodes", **kw) -> list[dict]:
    return datasets.read_table(store, dataset, **kw).to_pylist()


# --- objects -----------------------------------------------------------------------------


def test_objects_round_trip(store: ObjectStore) -> None:
    store.put_bytes("a/b/one.bin", b"1")
    store.put_bytes("a/two.bin", b"22")
    store.put_bytes("a/two.bin", b"second")
    store.put_bytes("z.bin", b"")
    assert store.get_bytes("a/two.bin") == b"second"
    assert store.list() == ["a/b/one.bin", "a/two.bin", "z.bin"]
    assert store.list("a/") == ["a/b/one.bin", "a/two.bin"]
    assert store.list("a/t") == ["a/two.bin"]
    assert store.exists("a/two.bin") and not store.exists("a/none")
    store.delete("a/two.bin")
    store.delete("a/two.bin")  # deleting twice is fine: retries stay idempotent
    assert store.list("a/") == ["a/b/one.bin"]
    assert store.uri("a/b/one.bin") == f"{store.url}/a/b/one.bin"


def test_a_missing_object_is_an_error_naming_it(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"no object at .*/gone/key\.bin"):
        store.get_bytes("gone/key.bin")
    with pytest.raises(StoreError, match=r"no object at .*/gone/key\.bin"):
        store.get_file("gone/key.bin", tmp_path / "download" / "key.bin")
    assert list(tmp_path.glob("download/*")) == []


@pytest.mark.services
def test_a_missing_bucket_is_named_with_the_endpoint(s3_server: str) -> None:
    store = open_store("s3://no-such-bucket/x", endpoint_url=s3_server)
    with pytest.raises(StoreError, match=rf"LIST s3://no-such-bucket/x/datasets/.* at {s3_server} .*NoSuchBucket"):
        datasets.read_table(store, "episodes")


def test_files_stream_in_and_out(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(bytes(range(256)) * 4096)
    store.put_file("blobs/big.bin", src)
    dest = tmp_path / "out" / "big.bin"
    store.get_file("blobs/big.bin", dest)
    assert dest.read_bytes() == src.read_bytes()
    assert [p.name for p in dest.parent.iterdir()] == ["big.bin"]


@pytest.mark.pure
@pytest.mark.parametrize("key", ["../x", "/etc/passwd", "a/../../b", "a//b", "", "./a", f"a/{TMP_PREFIX}x"])
def test_keys_that_could_escape_the_root_are_rejected(tmp_path: Path, key: str) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    with pytest.raises(StoreError, match="invalid object key"):
        store.put_bytes(key, b"x")
    assert list(tmp_path.rglob("*")) == []


@pytest.mark.pure
def test_a_failed_file_write_leaves_no_temp_file_and_keeps_the_old_object(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    store.put_bytes("d/keep", b"ok")
    (tmp_path / "store" / "d" / "busy").mkdir()  # the final rename onto d/busy fails after the data was written
    with pytest.raises(StoreError, match=r"could not write file://.*/d/busy"):
        store.put_bytes("d/busy", b"data")
    with pytest.raises(StoreError, match=r"could not write"):
        store.get_file("d/keep", tmp_path / "store" / "d" / "busy")
    assert sorted(p.name for p in (tmp_path / "store" / "d").iterdir()) == ["busy", "keep"]
    assert store.get_bytes("d/keep") == b"ok"


@pytest.mark.pure
@pytest.mark.parametrize("url", ["gs://bucket/x", "s3://", "file://", "/plain/path"])
def test_unsupported_store_urls_are_rejected(url: str) -> None:
    with pytest.raises(StoreError, match="unsupported store URL"):
        open_store(url)


# --- datasets ----------------------------------------------------------------------------


def test_published_parts_read_back_with_filters_on_partitions_and_columns(store: ObjectStore) -> None:
    key = datasets.write_part(store, "episodes", TABLE, partition=RUN, part="b0")
    datasets.write_part(store, "episodes", TABLE.slice(0, 1), partition={"run": "r2", "iteration": "0"}, part="b0")
    datasets.write_part(store, "episodes", TABLE.slice(1, 1), partition={"run": "r2", "iteration": "1"}, part="b0")
    assert key == "datasets/episodes/run=r1/iteration=0/part-b0.parquet"
    assert datasets.read_table(store, "episodes").num_rows == 5
    r1_gold = rows(store, filters={"run": "r1", "policy": "gold"}, columns=["episode_id", "run", "iteration"])
    assert r1_gold == [{"episode_id": e, "run": "r1", "iteration": "0"} for e in ("e1", "e3")]
    assert len(rows(store, filters={"iteration": ["0", "1"], "run": "r2"})) == 2
    assert rows(store, filters={"reward": "0.0"}, columns=["run"]) == [{"run": "r1"}, {"run": "r2"}]
    assert len(rows(store, filters={"reward": ["1", "0"]})) == 5
    assert [p["rows"] for p in datasets.list_parts(store, "episodes", filters={"run": "r2"})] == [1, 1]
    frame = datasets.read_pandas(store, "episodes", filters={"run": "r1"})
    assert list(frame["episode_id"]) == ["e1", "e2", "e3"]


def test_a_dataset_with_nothing_published_reads_as_an_empty_table(store: ObjectStore) -> None:
    assert datasets.read_table(store, "episodes").num_rows == 0
    assert datasets.read_pandas(store, "episodes").empty
    assert datasets.list_parts(store, "episodes") == []


def test_a_part_written_without_its_manifest_is_invisible(store: ObjectStore) -> None:
    """A crash after the part and before the manifest: the first half of write_part alone."""
    datasets.write_part(store, "episodes", TABLE, partition={"run": "r1"}, part="b0")
    datasets._put_part(store, "episodes", TABLE, partition={"run": "r1"}, part="b1")
    assert store.exists("datasets/episodes/run=r1/part-b1.parquet")
    assert [p["key"] for p in datasets.list_parts(store, "episodes")] == ["datasets/episodes/run=r1/part-b0.parquet"]
    assert datasets.read_table(store, "episodes").num_rows == 3


@pytest.mark.pure
def test_a_failed_publish_shows_nothing_and_its_retry_publishes_once(file_store: ObjectStore, tmp_path: Path) -> None:
    blocker = tmp_path / "store" / "datasets" / "episodes" / "_manifest" / "run=r1"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a directory")  # the manifest put fails for real, after the part is written
    with pytest.raises(StoreError, match=r"_manifest/run=r1/b0\.json"):
        datasets.write_part(file_store, "episodes", TABLE, partition={"run": "r1"}, part="b0")
    assert file_store.exists("datasets/episodes/run=r1/part-b0.parquet")
    assert datasets.read_table(file_store, "episodes").num_rows == 0
    blocker.unlink()
    datasets.write_part(file_store, "episodes", TABLE, partition={"run": "r1"}, part="b0")
    assert datasets.read_table(file_store, "episodes").num_rows == 3


def test_a_retried_part_replaces_its_rows_instead_of_adding_them(store: ObjectStore) -> None:
    for _ in range(3):
        datasets.write_part(store, "episodes", TABLE, partition=RUN, part="shard-7")
    datasets.write_part(store, "episodes", TABLE.slice(0, 2), partition=RUN, part="shard-7")
    assert [r["episode_id"] for r in rows(store)] == ["e1", "e2"]
    assert [p["rows"] for p in datasets.list_parts(store, "episodes")] == [2]


def test_the_schema_version_is_kept_in_parquet_and_in_the_manifest(store: ObjectStore) -> None:
    versioned = TABLE.replace_schema_metadata({datasets.SCHEMA_VERSION_KEY: b"3"})
    key = datasets.write_part(store, "episodes", versioned, partition=RUN, part="b0")
    (entry,) = datasets.list_parts(store, "episodes")
    assert entry["schema_version"] == "3" and entry["rows"] == 3 and entry["key"] == key
    data = store.get_bytes(key)
    assert entry["bytes"] == len(data)
    assert pq.read_schema(io.BytesIO(data)).metadata[datasets.SCHEMA_VERSION_KEY] == b"3"


@pytest.mark.pure
def test_rows_that_do_not_fit_the_schema_name_the_column(file_store: ObjectStore) -> None:
    schema = pa.schema([("episode_id", pa.string()), ("reward", pa.float64()), ("steps", pa.int32())])
    good = {"episode_id": "e", "reward": 1.0, "steps": 3}
    datasets.write_rows(file_store, "episodes", [good], schema, partition=RUN, part="b0")
    with pytest.raises(StoreError, match="column 'reward' \\(double\\) rejects a value"):
        datasets.write_rows(
            file_store, "episodes", [good, {**good, "reward": "high"}], schema, partition=RUN, part="b1"
        )
    with pytest.raises(StoreError, match=r"columns \['extra'\] that its schema does not declare"):
        datasets.write_rows(file_store, "episodes", [{**good, "extra": 1}], schema, partition=RUN, part="b1")
    assert rows(file_store, columns=["steps"]) == [{"steps": 3}]


@pytest.mark.pure
def test_parts_whose_column_types_conflict_name_the_column_and_parts(file_store: ObjectStore) -> None:
    datasets.write_part(file_store, "episodes", TABLE, partition={"run": "r1"}, part="b0")
    clash = TABLE.set_column(2, "reward", pa.array(["high", "low", "high"]))
    datasets.write_part(file_store, "episodes", clash, partition={"run": "r2"}, part="b0")
    with pytest.raises(StoreError, match=r"column 'reward' is double in .*run=r1.* but string in .*run=r2"):
        datasets.read_table(file_store, "episodes")


@pytest.mark.pure
def test_parts_with_an_added_column_unify_with_nulls(file_store: ObjectStore) -> None:
    datasets.write_part(file_store, "episodes", TABLE.slice(0, 1), partition={"run": "r1"}, part="b0")
    grown = TABLE.slice(1, 1).append_column("tokens", pa.array([7], pa.int64()))
    datasets.write_part(file_store, "episodes", grown, partition={"run": "r1"}, part="b1")
    assert rows(file_store, columns=["episode_id", "tokens"]) == [
        {"episode_id": "e1", "tokens": None},
        {"episode_id": "e2", "tokens": 7},
    ]


@pytest.mark.pure
def test_a_column_named_like_a_partition_key_must_agree_and_keeps_its_type(file_store: ObjectStore) -> None:
    typed = TABLE.append_column("iteration", pa.array([0, 0, 0], pa.int32()))
    datasets.write_part(file_store, "episodes", typed, partition=RUN, part="b0")
    assert datasets.read_table(file_store, "episodes", filters={"iteration": "0"}).schema.field("iteration").type == (
        pa.int32()
    )
    with pytest.raises(StoreError, match=r"column 'iteration' holds \['0'\] but the part is partitioned iteration=1"):
        datasets.write_part(file_store, "episodes", typed, partition={"run": "r1", "iteration": "1"}, part="b1")


@pytest.mark.pure
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"filters": {"rewrad": "1.0"}}, r"filter keys \['rewrad'\] are neither partition keys nor columns"),
        ({"columns": ["episode_id", "rewrad"]}, r"has no columns \['rewrad'\]"),
    ],
)
def test_unknown_filter_keys_and_columns_are_errors(file_store: ObjectStore, kwargs: dict, message: str) -> None:
    datasets.write_part(file_store, "episodes", TABLE, partition=RUN, part="b0")
    with pytest.raises(StoreError, match=message):
        datasets.read_table(file_store, "episodes", **kwargs)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("partition", "part"), [({"run": "a/b"}, "p"), ({"ru=n": "a"}, "p"), ({"run": "a"}, "../p"), ({"run": 1}, "p")]
)
def test_partition_values_and_part_names_cannot_reshape_the_layout(
    file_store: ObjectStore, partition: dict, part: str
) -> None:
    with pytest.raises(StoreError, match=r"invalid|must be a string"):
        datasets.write_part(file_store, "episodes", TABLE, partition=partition, part=part)


# --- outages -----------------------------------------------------------------------------


@pytest.mark.services
def test_a_write_while_s3_is_down_fails_after_retries_and_publishes_nothing(s3_server: str) -> None:
    """A dedicated server (s3_server only for its credentials) goes down between two writes and comes back."""
    server = MotoServer()
    server.start()
    try:
        url = f"s3://{create_bucket(server.endpoint)}/data"
        datasets.write_part(open_store(url, endpoint_url=server.endpoint), "episodes", TABLE, partition=RUN, part="b0")
        server.stop()
        down = open_store(url, endpoint_url=server.endpoint, max_attempts=2)
        with pytest.raises(StoreError, match=rf"{url}/datasets/episodes/.*b1.* at {server.endpoint} after up to 2 "):
            datasets.write_part(down, "episodes", TABLE.slice(0, 1), partition=RUN, part="b1")
        server.start()  # same port, same in-process state: what was published before is still there
        back = open_store(url, endpoint_url=server.endpoint)
        assert [p["key"].rsplit("/", 1)[1] for p in datasets.list_parts(back, "episodes")] == ["part-b0.parquet"]
        assert datasets.read_table(back, "episodes").num_rows == 3
    finally:
        server.stop()
