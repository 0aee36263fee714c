"""The environment server under load: step latency added over a direct sandbox exec, episodes/s, and what
clients killed mid-episode leave behind.

    .venv/bin/python benchmarks/env_server.py [--clients 1,2,4,8] [--episodes 3] [--tasks 4] [--kill 4]

The bundled tickets are ingested and validated into a temporary store. **Baseline, measured first in the same
run:** at each concurrency level, that many threads each hold a sandbox from the runtime's pool and run the
episode's commands through the environment (``CodingEnv.step``) directly: the latency of a step with no server
in the way. **Server:** `trialforge serve env` runs as its own process (loopback, bearer token); at each level,
that many client threads each play ``--episodes`` episodes: reset (a task drawn from the train split), the same
commands, close (graded in a fresh sandbox, as always: the last command
writes a file of the episode's own, so no verdict is reused). Printed per level: episodes/s over the level's wall
time, step latency p50/p99 through the server and directly, and the difference. **Kills:** ``--kill`` client
processes each start an episode and a long command, and are killed with SIGKILL; the benchmark waits for the
server to end those episodes (its idle timeout) and counts the sandboxes left, then stops the server (SIGTERM)
and counts again, and counts the episodes written to the store. Both counts must be 0 and every episode must be
written; the benchmark fails otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from trialforge import pipeline
from trialforge.config import load_params
from trialforge.envserver.client import EnvClient
from trialforge.rollout.env import Action, CodingEnv, EnvLimits
from trialforge.runtime import open_runtime
from trialforge.sandbox.host.reaper import reap
from trialforge.sandbox.host.statedir import STATE_ENV, private_dir
from trialforge.store import datasets
from trialforge.store.objstore import open_store
from trialforge.tasks.taskset import write_tasks

ROOT = Path(__file__).resolve().parents[1]
# The last one makes every episode's diff its own, so every close is graded (no verdict is reused).
COMMANDS = (
    "ls -la",
    "python3 -c 'print(2 + 2)'",
    "cat /etc/os-release",
    "grep -rn def . | head -20",
    "echo {n} > note",
)
TOKEN = "bench-" + "x" * 26
IDLE_S = 5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def direct(rt, image: str, level: int, rounds: int) -> list[float]:
    """Step latencies of ``level`` threads running the commands straight through CodingEnv."""
    latencies: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        with rt.pool.sandbox(image) as sandbox:
            env = CodingEnv(sandbox, "", EnvLimits())
            for n in range(rounds):
                for command in COMMANDS:
                    t0 = time.monotonic()
                    env.step(Action(tool="run", args={"command": command.format(n=n)}))
                    with lock:
                        latencies.append(time.monotonic() - t0)

    threads = [threading.Thread(target=worker) for _ in range(level)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def through_server(url: str, level: int, episodes: int) -> tuple[list[float], float, int]:
    """Step latencies, wall time and episodes closed for ``level`` clients playing ``episodes`` each."""
    latencies: list[float] = []
    closed = 0
    lock = threading.Lock()

    def worker(index: int) -> None:
        nonlocal closed
        client = EnvClient(url, TOKEN, max_wait_s=300)
        for n in range(episodes):
            seed = (level * 1000 + index) * 1000 + n  # never the same twice in a run: each diff is graded
            reset = client.reset(seed=seed, policy="bench")
            for turn, command in enumerate(COMMANDS):
                t0 = time.monotonic()
                client.step(reset.episode_id, "run", {"command": command.format(n=seed)}, turn=turn)
                with lock:
                    latencies.append(time.monotonic() - t0)
            verdict = client.close(reset.episode_id)
            assert verdict.status == "ok", verdict
            with lock:
                closed += 1
        client.shutdown()

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(level)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, time.monotonic() - start, closed


def kill_clients(url: str, count: int) -> list[str]:
    """``count`` client processes, each in a long command of its own episode, killed with SIGKILL."""
    script = (
        "import sys; from trialforge.envserver.client import EnvClient\n"
        "c = EnvClient(sys.argv[1], sys.argv[2]); r = c.reset(policy='killed'); print(r.episode_id, flush=True)\n"
        "c.step(r.episode_id, 'run', {'command': 'sleep 60'})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, url, TOKEN], stdout=subprocess.PIPE, text=True)
             for _ in range(count)]  # fmt: skip
    episodes = [p.stdout.readline().strip() for p in procs]
    deadline = time.monotonic() + 120
    while _sleeping() < count and time.monotonic() < deadline:  # their commands are running in the sandboxes
        time.sleep(0.1)
    for p in procs:
        p.kill()
        p.wait()
    return episodes


def _sleeping() -> int:
    """The clients' long commands running now: sandbox processes are host processes, whatever their namespaces."""
    found = subprocess.run(["pgrep", "-fc", "^sleep 60$"], capture_output=True, text=True)
    return int(found.stdout.strip() or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,2,4,8", help="comma-separated concurrency levels")
    parser.add_argument("--episodes", type=int, default=3, help="episodes per client at each level")
    parser.add_argument("--tasks", type=int, default=4, help="valid tasks to serve")
    parser.add_argument("--kill", type=int, default=4, help="clients killed mid-episode at the end")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]

    # The server's sandboxes, and only its, are counted here (beside /tmp, not in a 0700 directory: as root the
    # sandbox account must traverse the way to its workspaces).
    state = private_dir(Path(tempfile.gettempdir()) / f"tf-bench-envserver-state-{os.getpid()}")
    try:
        run(args, levels, state)
    finally:
        reap(state, everything=True)
        shutil.rmtree(state, ignore_errors=True)


def run(args: argparse.Namespace, levels: list[int], state: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="tf-bench-envserver-") as tmp:
        settings = {
            "run.store": f"file://{tmp}/store",
            "sources.tickets": str(ROOT / "tasks_src" / "tickets" / "github_issues.jsonl"),
            "sources.repos": str(ROOT / "tasks_src" / "repos"),
            "validate.runs": 1,
            "sandbox.max_live": 2 * max(levels) + args.kill,
        }
        with open_runtime(load_params(None, settings)) as rt:
            tasks, _ = pipeline.ingest(rt)
            valid = [t for t in pipeline.validate(rt, tasks)[0] if t.validation.valid][: args.tasks]
            write_tasks(Path(tmp) / "tasks.parquet", valid)
            print(f"{len(valid)} valid tasks served; {len(COMMANDS)} commands per episode; {os.cpu_count()} CPUs")
            baseline = {level: direct(rt, rt.image.name, level, args.episodes) for level in levels}

        server_settings = {
            **settings,
            "env_server.tasks": f"{tmp}/tasks.parquet",
            "env_server.port": 0,
            "env_server.max_live": max(levels) + args.kill,
            "env_server.idle_timeout_s": IDLE_S,
            "env_server.token_env": "BENCH_ENV_TOKEN",
        }
        cmd = [
            sys.executable,
            "-m",
            "trialforge.cli",
            "serve",
            "env",
            *(f"--set={k}={v}" for k, v in server_settings.items()),
        ]
        env = os.environ | {"BENCH_ENV_TOKEN": TOKEN, STATE_ENV: str(state)}
        server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline()
            url, run_id = line.split(" at ")[1].split(" ")[0], line.rsplit("; ", 1)[1].strip()
            print(f"{'clients':>7} {'episodes':>8} {'wall s':>7} {'ep/s':>6} {'server p50':>10} {'p99':>6} "
                  f"{'direct p50':>10} {'p99':>6} {'added p50':>9} {'p99':>6}  (step latency, ms)")  # fmt: skip
            total = 0
            for level in levels:
                latencies, wall, closed = through_server(url, level, args.episodes)
                total += closed
                base = baseline[level]
                s50, s99 = percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3
                d50, d99 = percentile(base, 0.5) * 1e3, percentile(base, 0.99) * 1e3
                print(f"{level:>7} {closed:>8} {wall:>7.1f} {closed / wall:>6.2f} {s50:>10.1f} {s99:>6.1f} "
                      f"{d50:>10.1f} {d99:>6.1f} {s50 - d50:>9.1f} {s99 - d99:>6.1f}")  # fmt: skip
            killed = kill_clients(url, args.kill)
            deadline = time.monotonic() + IDLE_S + 120
            while httpx.get(f"{url}/health").json()["live"] and time.monotonic() < deadline:
                time.sleep(0.5)
            left_live = len(list((state / "sandboxes").glob("tf-*")))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=300)
        left_after = len(list((state / "sandboxes").glob("tf-*")))
        rows = datasets.read_table(open_store(f"file://{tmp}/store"), "episodes", filters={"run": run_id}).to_pylist()
        killed_rows = [r for r in rows if r["episode_id"] in killed]
        graded = [r for r in rows if r["policy"] == "bench"]
        distinct = len({json.loads(r["verifier_report"])["provenance"]["diff_sha256"] for r in graded})
        verify_s = sum(r["verify_s"] for r in graded) / max(len(graded), 1)
        print(f"{len(graded)} episodes closed and graded ({distinct} distinct diffs), {verify_s:.2f} s of verification "
              "each (diff extraction + the graded run in a fresh sandbox)")  # fmt: skip
        print(f"killed {len(killed)} clients mid-command: sandboxes left after their episodes ended {left_live}, "
              f"after the server stopped {left_after}; episodes written {len(rows)} of {total + len(killed)} "
              f"(the killed ones: {sorted({r['status'] for r in killed_rows})})")  # fmt: skip
        ok = left_live == left_after == 0 and len(rows) == total + len(killed) and len(killed_rows) == len(killed)
        if not ok:
            raise SystemExit("FAILED: sandboxes leaked or episodes lost")


if __name__ == "__main__":
    main()
