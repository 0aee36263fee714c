"""Inference: a local causal LM served over vLLM's OpenAI-compatible HTTP API, for rollouts where vLLM cannot run."""
