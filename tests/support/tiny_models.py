"""A randomly initialised GPT-2 with a byte-level tokenizer (256 bytes + end of text), built here: nothing is
downloaded. The tests' ``tiny_lm`` fixture and the inference benchmark use it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def byte_level_gpt2(path: Path, n_layer: int = 2, n_embd: int = 32, n_head: int = 2, seed: int = 0) -> tuple[Any, Any]:
    """The model and its tokenizer, saved to ``path`` (a context of 2048 tokens)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    vocab["<|endoftext|>"] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>")
    eos = tokenizer.eos_token_id
    config = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=2048, vocab_size=len(vocab),
                        bos_token_id=eos, eos_token_id=eos)  # fmt: skip
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer
