"""Trainer-side adapters: external RL libraries (TRL, verifiers) driving episodes on an environment server."""
