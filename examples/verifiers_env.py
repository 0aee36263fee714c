"""Run a model on tasks served by `trialforge serve env` through verifiers 0.4.0's eval runner (docs/env-server.md).

    export TRIALFORGE_ENV_TOKEN=...          # the token the server was started with
    trialforge serve env &                   # 127.0.0.1:8765 by default
    vllm serve Qwen/Qwen3-8B --enable-auto-tool-choice --tool-call-parser hermes &
    python examples/verifiers_env.py --model Qwen/Qwen3-8B --base-url http://127.0.0.1:8000/v1 --task ledgerlite-3

Each episode is a verifiers trace (the model's turns, recorded by verifiers' interception) whose reward is the
server's verdict; an episode without one fails instead of scoring 0. Traces land in --output-dir as verifiers
writes them (traces.jsonl), the same records a verifiers trainer consumes for a group of --rollouts per task.
"""

from __future__ import annotations

import argparse
import asyncio

from verifiers.v1.cli.eval.runner import run_eval
from verifiers.v1.configs.cli.eval import EvalConfig

from trialforge.envserver.adapters.verifiers import PLUGIN_ID  # verifiers loads it as `trialforge_env`


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8765", help="the environment server")
    parser.add_argument("--model", required=True, help="the model's name at --base-url")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="an OpenAI-compatible endpoint")
    parser.add_argument("--api-key-var", default="OPENAI_API_KEY", help="the variable holding its API key")
    parser.add_argument("--task", action="append", default=[], help="a task id (repeat); none: --draws")
    parser.add_argument("--draws", type=int, default=0, help="tasks drawn from the train split instead")
    parser.add_argument("--rollouts", type=int, default=4, help="episodes per task: a trainer's group")
    parser.add_argument("--max-concurrent", type=int, default=8, help="episodes at once (within the server's max_live)")
    parser.add_argument("--output-dir", default="out/verifiers")
    args = parser.parse_args()

    taskset = {"id": PLUGIN_ID, "url": args.url, "task_ids": args.task, "draws": args.draws}  # $TRIALFORGE_ENV_TOKEN
    config = EvalConfig(
        env={"taskset": taskset},
        model=args.model,
        client={"type": "eval", "base_url": args.base_url, "api_key_var": args.api_key_var},
        num_rollouts=args.rollouts,
        max_concurrent=args.max_concurrent,
        push=False,
        output_dir=args.output_dir,
    )
    episodes = asyncio.run(run_eval(config))
    scored = [e.traces[0].reward for e in episodes if e.ok]
    mean = sum(scored) / len(scored) if scored else float("nan")
    print(f"{len(scored)} of {len(episodes)} episodes scored, mean reward {mean:.3f}; traces in {args.output_dir}")


if __name__ == "__main__":
    main()
