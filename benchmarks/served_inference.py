"""Sampling through an inference server against sampling in process, and what a new version costs to reach it.

    .venv/bin/python benchmarks/served_inference.py [--layers 4] [--width 256] [--requests 16]
        [--concurrency 4] [--max-new-tokens 32] [--versions 3] [--threads N]

A random GPT-2 (``--layers`` x ``--width``, byte-level tokenizer, built here) is sampled ``--requests`` times
with the same prompt and seeds: first in this process (``HFPolicy.draw``, the baseline: what a rollout does
without ``train.inference``), then through ``trialforge serve lm`` over HTTP, one request at a time and
``--concurrency`` at once. Both use ``--threads`` torch threads. Then ``--versions`` new versions reach the
server as the run sends them (``train.served.WeightSync.ensure``): LoRA adapters (vLLM's route) and full
weights (SGLang's), each timed from the checkpoint in the store to the server answering with it, beside the
time the trainer takes to save that checkpoint. Prints one table; figures are wall-clock on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

from support.tiny_models import byte_level_gpt2  # noqa: E402

from trialforge.rollout.hf_policy import HFPolicy  # noqa: E402
from trialforge.store.objstore import open_store  # noqa: E402
from trialforge.train.device import pick_device  # noqa: E402
from trialforge.train.lm import LMTrainer, OptimConfig  # noqa: E402
from trialforge.train.served import WeightSync  # noqa: E402
from trialforge.train.settings import InferenceParams, LoraParams  # noqa: E402

PROMPT = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "add() subtracts: fix it"}]


@contextlib.contextmanager
def server(model: Path, threads: int, max_new_tokens: int) -> Iterator[str]:
    argv = [sys.executable, "-m", "trialforge.cli", "serve", "lm", str(model), "--served-model-name", "bench",
            "--port", "0", "--threads", str(threads), "--max-new-tokens", str(max_new_tokens)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 300)
        line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if not line.startswith("serving "):
            raise SystemExit(f"the server did not start: {line!r}")
        yield line.strip().rpartition(" at ")[2]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def in_process(model: Path, requests: int, max_new_tokens: int) -> tuple[float, int]:
    """Seconds and tokens for ``requests`` samples drawn here."""
    policy = HFPolicy(str(model), max_new_tokens=max_new_tokens)
    prompt = policy.encode(PROMPT)
    policy.draw(prompt, torch.Generator().manual_seed(0))  # warm-up
    start, tokens = time.perf_counter(), 0
    for seed in range(requests):
        ids, _, _ = policy.draw(prompt, torch.Generator().manual_seed(seed))
        tokens += len(ids)
    return time.perf_counter() - start, tokens


def over_http(url: str, requests: int, concurrency: int, max_new_tokens: int) -> tuple[float, int]:
    """Seconds and tokens for ``requests`` chat completions, ``concurrency`` in flight."""
    with httpx.Client(base_url=url, timeout=600) as http:

        def one(seed: int) -> int:
            body = {"model": "bench", "messages": PROMPT, "seed": seed, "max_tokens": max_new_tokens,
                    "logprobs": True, "return_token_ids": True}  # fmt: skip
            answer = http.post("/chat/completions", json=body)
            answer.raise_for_status()
            return len(answer.json()["choices"][0]["token_ids"])

        one(0)  # warm-up
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            tokens = sum(pool.map(one, range(requests)))
        return time.perf_counter() - start, tokens


def sync_times(model: Path, url: str, lora: bool, versions: int, work: Path) -> tuple[list[float], list[float], int]:
    """Per version: seconds to save the checkpoint, seconds from the store to the server answering with it; and
    the bytes written for the server per version (the tokenizer's files included)."""
    store = open_store(f"file://{work / ('store-lora' if lora else 'store-full')}")
    trainer = LMTrainer(
        str(model), OptimConfig(lr=1e-3), device=pick_device("cpu"), lora=LoraParams(r=16) if lora else None
    )
    api = "vllm" if lora else "sglang"
    sync = WeightSync(InferenceParams(url=url, api=api, model_name="bench"), str(model), work / f"served-{api}", 0)
    saves, syncs = [], []
    for version in range(1, versions + 1):
        with torch.no_grad():
            for p in trainer.model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 1e-3)  # a new version (the benchmark times moving it, not making it)
        trainer.version = version
        key = f"checkpoints/bench-{api}/lm-v{version}.pt"
        start = time.perf_counter()
        trainer.save(store, key)
        saves.append(time.perf_counter() - start)
        start = time.perf_counter()
        sync.ensure(store, key)
        syncs.append(time.perf_counter() - start)
    size = sum(f.stat().st_size for f in (work / f"served-{api}").rglob("*") if f.is_file()) // versions
    return saves, syncs, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="tf-bench-served-") as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        model, _ = byte_level_gpt2(model_dir, n_layer=args.layers, n_embd=args.width, n_head=4)
        params = sum(p.numel() for p in model.parameters())
        print(f"random GPT-2: {args.layers} layers x {args.width}, {params / 1e6:.1f} M parameters; {args.requests} "
              f"samples of up to {args.max_new_tokens} tokens; {args.threads} torch threads")  # fmt: skip
        rows = [("in process (baseline)", *in_process(model_dir, args.requests, args.max_new_tokens))]
        with server(model_dir, args.threads, args.max_new_tokens) as url:
            rows.append(("server, 1 at a time", *over_http(url, args.requests, 1, args.max_new_tokens)))
            rows.append((f"server, {args.concurrency} at once",
                         *over_http(url, args.requests, args.concurrency, args.max_new_tokens)))  # fmt: skip
            lora = sync_times(model_dir, url, True, args.versions, work)
            full = sync_times(model_dir, url, False, args.versions, work)
        print("\n| sampling | seconds | tokens | tokens/s | ms per request |\n| --- | --- | --- | --- | --- |")
        for name, seconds, tokens in rows:
            print(
                f"| {name} | {seconds:.2f} | {tokens} | {tokens / seconds:.0f} | {1000 * seconds / args.requests:.0f} |"
            )
        print("\n| new version | save checkpoint ms (median) | reach the server ms (median) | bytes written for it |")
        print("| --- | --- | --- | --- |")
        for name, (saves, syncs, size) in (("LoRA r=16, vLLM route", lora), ("full weights, SGLang route", full)):
            print(
                f"| {name} | {1000 * statistics.median(saves):.0f} | {1000 * statistics.median(syncs):.0f} | {size:,} |"
            )


if __name__ == "__main__":
    main()
