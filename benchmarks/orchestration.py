"""Orchestration overhead of the rollout flow: the share of its wall time in which no shard was working.

    .venv/bin/python benchmarks/orchestration.py [--tickets 3] [--group-size 2] [--shard-size 4] [--runs 2]

Starts a Prefect server on 127.0.0.1 (the Ray runner needs one) and a local Ray instance (2 CPUs),
curates the first --tickets bundled tickets once, then runs the rollout flow --runs times with each
runner (a new run id each time, so every shard runs). For each run:

- wall: the flow call, start to finish (flow run, task set, plan, shards, artifacts);
- work: the union of the shards' working intervals (sandbox slots held to part published), so shards
  running side by side on Ray count once;
- overhead = (wall - work) / wall: flow and task bookkeeping, runtime and worker start-up, idle waits.

The first run of each runner pays its process-level start-up (imports, a Ray worker's first task);
later runs show the steady state.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from support.prefect_server import PrefectServer  # noqa: E402  (tests/: the same server the test suite starts)


def busy_time(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tickets", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--shard-size", type=int, default=4)
    parser.add_argument("--policies", default="gold,noop")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tf-bench-orch-") as tmp_dir:
        tmp = Path(tmp_dir)
        os.environ["TRIALFORGE_STATE_DIR"] = str(tmp / "state")
        tickets = tmp / "tickets.jsonl"
        lines = (ROOT / "tasks_src" / "tickets" / "github_issues.jsonl").read_text().splitlines()
        tickets.write_text("\n".join(lines[: args.tickets]) + "\n")
        (tmp / "params.yaml").write_text("{}\n")
        overrides = {
            "sources.tickets": str(tickets),
            "sources.repos": str(ROOT / "tasks_src" / "repos"),
            "sources.eval_set": str(ROOT / "tasks_src" / "eval" / "heldout.jsonl"),
            "validate.runs": 1,
            "rollout.group_size": args.group_size,
            "rollout.policies": args.policies.split(","),
            "quality.gates": [],  # curation is not what this measures
            "quality.enforce": [],
            "run.store": f"file://{tmp / 'store'}",
            "run.out_dir": str(tmp / "out"),
        }
        server = PrefectServer(tmp / "prefect")
        server.start()
        try:
            rows = _measure(server, str(tmp / "params.yaml"), overrides, args)
        finally:
            server.stop()
    print(f"\n{'runner':8} {'run':>3} {'shards':>6} {'episodes':>8} {'wall s':>8} {'work s':>8} {'overhead':>14}")
    for runner, n, shards, episodes, wall, work in rows:
        overhead = f"{wall - work:.2f} s {(wall - work) / wall:>5.1%}"
        print(f"{runner:8} {n:>3} {shards:>6} {episodes:>8} {wall:>8.2f} {work:>8.2f} {overhead:>14}")


def _measure(server: PrefectServer, params_path: str, overrides: dict, args: argparse.Namespace) -> list[tuple]:
    import ray
    from prefect.flows import load_flow_from_entrypoint
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    def flow(name: str):
        return load_flow_from_entrypoint(f"{ROOT / 'flows' / name}.py:{name}")

    rows = []
    with temporary_settings({PREFECT_API_URL: server.api_url, PREFECT_HOME: server.home}):
        ingested = flow("ingest")(params_path=params_path, overrides=overrides)
        curated = flow("curate")(params_path=params_path, overrides=overrides, ingested=ingested.version)
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
        try:
            rollout = flow("rollout")
            for runner in ("default", "ray"):
                for n in range(1, args.runs + 1):
                    start = time.monotonic()
                    result = rollout(
                        run_id=f"bench-{runner}-{n}",
                        params_path=params_path,
                        overrides=overrides,
                        task_set=curated.version,
                        runner=runner,
                        shard_size=args.shard_size,
                    )
                    wall = time.monotonic() - start
                    work = busy_time([(r.started_at, r.finished_at) for r in result.reports])
                    rows.append((runner, n, len(result.reports), result.episodes, wall, work))
        finally:
            ray.shutdown()
    return rows


if __name__ == "__main__":
    main()
