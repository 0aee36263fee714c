"""Parquet datasets through write_part/read_table, on file:// and on S3, against a JSON-lines baseline.

    PYTHONPATH=src .venv/bin/python benchmarks/store.py [--rows 10000] [--parts 4] [--steps-per-episode 6]

Generates synthetic episode rows (20 columns, a few KB of diff each) and step rows
(action and observation text), then per store (a temp directory, and a moto S3 server
this script starts on 127.0.0.1 and stops) and per dataset: writes them as --parts
parts, reads them back, and writes and reads the same rows as JSON lines in the same
store. MB/s counts the rows' uncompressed Arrow size. The baseline is read into an
Arrow table by pyarrow's own JSON reader, so both sides end with the same table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import boto3
import pyarrow as pa
import pyarrow.json as pajson

from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore, open_store

EPISODE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("iteration", pa.int32()),
        ("episode_id", pa.string()),
        ("task_id", pa.string()),
        ("policy", pa.string()),
        ("group_id", pa.string()),
        ("sample", pa.int32()),
        ("seed", pa.int64()),
        ("status", pa.string()),
        ("termination", pa.string()),
        ("reward", pa.float64()),
        ("final_diff", pa.string()),
        ("verifier_report", pa.string()),
        ("steps", pa.int32()),
        ("tokens_in", pa.int64()),
        ("tokens_out", pa.int64()),
        ("duration_s", pa.float64()),
        ("exec_s", pa.float64()),
        ("verify_s", pa.float64()),
        ("code_version", pa.string()),
    ]
)
STEP_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("step", pa.int32()),
        ("tool", pa.string()),
        ("action", pa.string()),
        ("observation", pa.string()),
        ("exec_s", pa.float64()),
        ("tokens_in", pa.int64()),
        ("logprob", pa.float64()),
    ]
)
T = TypeVar("T")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


# --- synthetic rows ----------------------------------------------------------------------


class Text:
    """Code-like lines drawn from a fixed pool, so text compresses like real diffs and logs, not like noise."""

    def __init__(self, rng: random.Random, pool: int = 4000) -> None:
        self.rng = rng
        words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 10))) for _ in range(800)]
        self.lines = [self._line(words) for _ in range(pool)]

    def _line(self, words: list[str]) -> str:
        w = self.rng.choices(words, k=6)
        return self.rng.choice(
            [
                f"    {w[0]} = {w[1]}.{w[2]}({w[3]}, {w[4]}={self.rng.randint(0, 999)})",
                f"def {w[0]}_{w[1]}(self, {w[2]}: {w[3]}) -> {w[4]}:",
                f"        return {w[0]}[{w[1]}] + {w[2]}",
                f"    if {w[0]} is None or not {w[1]}.{w[2]}:",
                f"tests/test_{w[0]}.py::test_{w[1]}_{w[2]} PASSED",
            ]
        )

    def block(self, lines: int, prefixes: str = " ") -> str:
        return "\n".join(self.rng.choice(prefixes) + self.rng.choice(self.lines) for _ in range(lines))

    def diff(self) -> str:
        path = f"src/{self.rng.choice(self.lines).split()[0].strip(':')}.py"
        return f"--- a/{path}\n+++ b/{path}\n@@ -1,40 +1,42 @@\n" + self.block(self.rng.randint(40, 80), " +-")


def episode_rows(n: int, text: Text) -> list[dict]:
    rng = text.rng
    return [
        {
            "run_id": "bench",
            "iteration": i % 4,
            "episode_id": f"ep-{i:08d}",
            "task_id": f"task-{rng.randint(0, 499):04d}",
            "policy": rng.choice(["gold", "noop", "repair"]),
            "group_id": f"g-{i // 8:06d}",
            "sample": i % 8,
            "seed": rng.getrandbits(48),
            "status": rng.choice(["ok", "ok", "ok", "env_error"]),
            "termination": rng.choice(["submitted", "max_turns", "timeout"]),
            "reward": rng.random(),
            "final_diff": text.diff(),
            "verifier_report": json.dumps({"passed": rng.randint(0, 20), "failed": rng.randint(0, 5)}),
            "steps": rng.randint(1, 12),
            "tokens_in": rng.randint(1_000, 60_000),
            "tokens_out": rng.randint(100, 4_000),
            "duration_s": rng.uniform(1, 120),
            "exec_s": rng.uniform(0, 60),
            "verify_s": rng.uniform(0, 30),
            "code_version": "0123456789abcdef0123456789abcdef01234567",
        }
        for i in range(n)
    ]


def step_rows(episodes: list[dict], per_episode: int, text: Text) -> list[dict]:
    rng = text.rng
    return [
        {
            "episode_id": episode["episode_id"],
            "step": step,
            "tool": rng.choice(["bash", "edit", "view", "submit"]),
            "action": text.block(rng.randint(1, 4)),
            "observation": text.block(rng.randint(5, 25)),
            "exec_s": rng.uniform(0, 5),
            "tokens_in": rng.randint(500, 8_000),
            "logprob": -rng.random() * 50,
        }
        for episode in episodes
        for step in range(per_episode)
    ]


# --- stores ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto server in its own process, so it does not compete with the client for the GIL."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_up(endpoint, proc)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def wait_until_up(endpoint: str, proc: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode} before serving {endpoint}")
        with contextlib.suppress(urllib.error.URLError, ConnectionError):
            urllib.request.urlopen(endpoint, timeout=1).close()
            return
        time.sleep(0.1)
    raise RuntimeError(f"moto server did not answer at {endpoint} within {timeout_s:.0f} s")


@contextlib.contextmanager
def stores() -> Iterator[list[tuple[str, ObjectStore]]]:
    os.environ.update(CREDENTIALS)
    with tempfile.TemporaryDirectory(prefix="tf-bench-store-") as tmp, moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        yield [("file", open_store(f"file://{tmp}")), ("s3", open_store("s3://bench/data", endpoint_url=endpoint))]


# --- measurement -------------------------------------------------------------------------


@dataclass
class Result:
    store: str
    dataset: str
    rows: int
    arrow_mb: float
    write_s: float
    read_s: float
    parquet_mb: float
    jsonl_write_s: float
    jsonl_read_s: float
    jsonl_mb: float


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def slices(table: pa.Table, parts: int) -> list[pa.Table]:
    size = -(-table.num_rows // parts)
    return [table.slice(i * size, size) for i in range(parts)]


def write_parquet(store: ObjectStore, dataset: str, tables: list[pa.Table]) -> None:
    for i, table in enumerate(tables):
        datasets.write_part(store, dataset, table, partition={"run": "bench"}, part=f"{i:04d}")


def write_jsonl(store: ObjectStore, dataset: str, tables: list[pa.Table]) -> int:
    written = 0
    for i, table in enumerate(tables):
        data = "".join(json.dumps(row) + "\n" for row in table.to_pylist()).encode()
        store.put_bytes(f"jsonl/{dataset}/part-{i:04d}.jsonl", data)
        written += len(data)
    return written


def read_jsonl(store: ObjectStore, dataset: str) -> pa.Table:
    options = pajson.ReadOptions(block_size=8 << 20)
    tables = [
        pajson.read_json(io.BytesIO(store.get_bytes(key)), read_options=options)
        for key in store.list(f"jsonl/{dataset}/")
    ]
    return pa.concat_tables(tables)


def measure(name: str, store: ObjectStore, dataset: str, table: pa.Table, parts: int) -> Result:
    tables = slices(table, parts)
    write_s, _ = timed(lambda: write_parquet(store, dataset, tables))
    read_s, back = timed(lambda: datasets.read_table(store, dataset))
    assert back.num_rows == table.num_rows, f"{name}/{dataset}: read {back.num_rows} rows, wrote {table.num_rows}"
    jsonl_write_s, jsonl_bytes = timed(lambda: write_jsonl(store, dataset, tables))
    jsonl_read_s, jsonl_back = timed(lambda: read_jsonl(store, dataset))
    assert jsonl_back.num_rows == table.num_rows
    parquet_bytes = sum(entry["bytes"] for entry in datasets.list_parts(store, dataset))
    return Result(
        name, dataset, table.num_rows, table.nbytes / 1e6, write_s, read_s, parquet_bytes / 1e6,
        jsonl_write_s, jsonl_read_s, jsonl_bytes / 1e6,
    )  # fmt: skip


def report(results: list[Result]) -> None:
    head = (
        f"{'store':5} {'dataset':8} {'rows':>7} {'MB':>6} | {'wr MB/s':>7} {'wr rows/s':>9} {'rd MB/s':>7} "
        f"{'rd rows/s':>9} | {'pq MB':>6} {'jsonl MB':>8} {'size x':>6} | {'pq rd s':>7} {'jsonl rd s':>10} "
        f"{'read x':>6} {'jsonl wr s':>10}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r.store:5} {r.dataset:8} {r.rows:7d} {r.arrow_mb:6.1f} | {r.arrow_mb / r.write_s:7.1f} "
            f"{r.rows / r.write_s:9.0f} {r.arrow_mb / r.read_s:7.1f} {r.rows / r.read_s:9.0f} | "
            f"{r.parquet_mb:6.2f} {r.jsonl_mb:8.2f} {r.jsonl_mb / r.parquet_mb:6.2f} | {r.read_s:7.3f} "
            f"{r.jsonl_read_s:10.3f} {r.jsonl_read_s / r.read_s:6.2f} {r.jsonl_write_s:10.3f}"
        )
    print(
        "MB: uncompressed Arrow size of the rows. size x = JSON-lines bytes / Parquet bytes; "
        "read x = JSON-lines read time / Parquet read time (both into an Arrow table)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000, help="episode rows (steps: rows x --steps-per-episode)")
    parser.add_argument("--steps-per-episode", type=int, default=6)
    parser.add_argument("--parts", type=int, default=4, help="parts each dataset is written as")
    args = parser.parse_args()

    started = time.perf_counter()
    text = Text(random.Random(0))
    episodes = episode_rows(args.rows, text)
    tables = {
        "episodes": pa.Table.from_pylist(episodes, schema=EPISODE_SCHEMA),
        "steps": pa.Table.from_pylist(step_rows(episodes, args.steps_per_episode, text), schema=STEP_SCHEMA),
    }
    took = time.perf_counter() - started
    print(f"generated {args.rows} episodes and {tables['steps'].num_rows} steps in {took:.1f} s")
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}: the figures scale with whatever else runs")
    with stores() as found:
        results = [measure(name, store, ds, table, args.parts) for name, store in found for ds, table in tables.items()]
    report(results)
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
