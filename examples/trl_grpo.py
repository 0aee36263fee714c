"""Train a model with TRL's GRPOTrainer online on tasks served by `trialforge serve env` (docs/env-server.md).

    export TRIALFORGE_ENV_TOKEN=...          # the token the server was started with
    trialforge serve env &                   # 127.0.0.1:8765 by default
    python examples/trl_grpo.py --model Qwen/Qwen3-0.6B --task ledgerlite-3 --generations 4

The model needs a chat template TRL can parse tool calls from (Qwen, Llama 3.1+, GPT-OSS, ...). Each task is one
dataset row and its --generations rollouts form a GRPO group; every rollout of a generation batch holds one of the
server's episodes until its reward is read, so keep --generations (the batch here) within the server's max_live.
"""

from __future__ import annotations

import argparse

from trl import GRPOConfig, GRPOTrainer

from trialforge.envserver.adapters.trl import ToolEnvFactory, task_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8765", help="the environment server")
    parser.add_argument("--model", required=True, help="a local model directory or a hub id")
    parser.add_argument("--task", action="append", default=[], help="a task id (repeat); none: --draws")
    parser.add_argument("--draws", type=int, default=0, help="tasks drawn from the train split instead")
    parser.add_argument("--tier", help="the difficulty tier to draw from")
    parser.add_argument("--generations", type=int, default=4, help="rollouts per task: the GRPO group")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--max-turns", type=int, default=20, help="tool calls per rollout (the server caps them too)")
    parser.add_argument("--output-dir", default="out/trl-grpo")
    args = parser.parse_args()

    factory = ToolEnvFactory(args.url, policy="trl-grpo", policy_version=args.model)  # $TRIALFORGE_ENV_TOKEN
    config = GRPOConfig(
        output_dir=args.output_dir,
        num_generations=args.generations,
        per_device_train_batch_size=args.generations,  # one group per step: one batch of episodes on the server
        max_steps=args.steps,
        max_completion_length=16384,  # the whole episode: tool calls, observations and tool results
        max_tool_calling_iterations=args.max_turns,
        logging_steps=1,
        report_to="none",
    )
    trainer = GRPOTrainer(
        model=args.model,
        args=config,
        train_dataset=task_dataset(args.task or None, draws=args.draws, tier=args.tier),
        environment_factory=factory,  # rewards: the episodes' verdicts (unknown ones are masked, never 0)
    )
    try:
        trainer.train()
    finally:
        factory.close()


if __name__ == "__main__":
    main()
