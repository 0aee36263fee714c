"""Throughput of one LM training update (forward, backward, clip, AdamW step), in tokens per second.

    .venv/bin/python benchmarks/train_step.py [--size tiny|gpt2] [--episodes 8] [--group 4] [--steps 3]
        [--prompt 64] [--observation 32] [--generated 32] [--updates 3] [--accum 1] [--checkpointing]
        [--device auto|cpu|cuda]

A random-init GPT-2 (``tiny``: 2 layers of width 64, vocab 512; ``gpt2``: the 124M configuration) trains
on synthetic multi-turn episodes shaped like a local HF policy's: each step's prompt extends the last with
the previous reply and ``--observation`` tokens, and the policy generates ``--generated`` tokens per step.
The behaviour log-probabilities are made up (-1 per token): they change the loss's values, not its cost.
Rewards alternate within each group so every group carries signal. The first update warms up and is not
counted; the median of the rest is reported. ``auto`` takes CUDA with bf16 autocast when available.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from trialforge.store.records import EpisodeRecord, StepRecord
from trialforge.train.device import pick_device
from trialforge.train.lm import LMTrainer, OptimConfig

SIZES = {
    "tiny": {"vocab_size": 512, "n_positions": 1024, "n_embd": 64, "n_layer": 2, "n_head": 2},
    "gpt2": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12},
}


def synthetic_episode(i: int, group: int, args: argparse.Namespace, vocab: int, gen: torch.Generator) -> EpisodeRecord:
    def tokens(n: int) -> list[int]:
        return torch.randint(1, vocab, (n,), generator=gen).tolist()

    prompt = tokens(args.prompt)
    steps = []
    for k in range(args.steps):
        ids = tokens(args.generated)
        info = {"prompt_ids": prompt, "token_ids": ids, "token_logprobs": [-1.0] * len(ids), "temperature": 1.0}
        steps.append(StepRecord("bench", 0, f"e{i}", k, "run", "{}", "", False, 0.0, 0.0, len(prompt), len(ids),
                                -float(len(ids)), json.dumps(info)))  # fmt: skip
        prompt = prompt + ids + tokens(args.observation)
    return EpisodeRecord(
        "bench", 0, f"e{i}", f"task{group}", "ts", "easy", "hf", "v0", f"g{group}", i, i, "none", "", 0, "ok", "",
        "submitted", float(i % 2), "", "{}", "[]", "", args.steps, args.steps, 0, 0, 0, 0, 0, 0, 0, "", "",
        step_rows=steps,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--observation", type=int, default=32)
    parser.add_argument("--generated", type=int, default=32)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel

    if not torch.cuda.is_available():
        print("CUDA is not available here (no GPU lent to this run): measuring the CPU, float32")
    device = pick_device(None if args.device == "auto" else args.device)
    torch.manual_seed(0)
    config = GPT2Config(
        **SIZES[args.size], bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    model = GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())
    trainer = LMTrainer(model, OptimConfig(lr=1e-6), device=device, grad_accum_steps=args.accum,
                        gradient_checkpointing=args.checkpointing)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    batch = [synthetic_episode(i, i // args.group, args, config.vocab_size, gen) for i in range(args.episodes)]
    print(f"model {args.size}: {n_params / 1e6:.1f}M parameters on {device.describe()}; torch threads "
          f"{torch.get_num_threads()}; {args.episodes} episodes x {args.steps} steps, accum {args.accum}, "
          f"checkpointing {args.checkpointing}")  # fmt: skip
    rates = []
    for u in range(args.updates):
        stats = trainer.update(batch)
        if device.kind == "cuda":
            torch.cuda.synchronize()
        print(f"update {u}: {stats.forward_tokens} tokens ({stats.tokens} generated) in {stats.seconds:.3f}s = "
              f"{stats.tokens_per_s:,.0f} tokens/s; loss {stats.loss:+.4f} grad_norm {stats.grad_norm:.3f}"
              + (" (warm-up, not counted)" if u == 0 and args.updates > 1 else ""))  # fmt: skip
        if u > 0 or args.updates == 1:
            rates.append(stats.tokens_per_s)
    memory = f"; peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if device.kind == "cuda" else ""
    print(f"median {statistics.median(rates):,.0f} tokens/s ({args.size}, {device.describe()}){memory}")


if __name__ == "__main__":
    main()
