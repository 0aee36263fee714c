"""Sandboxes: one protocol (base.py), one module per backend (bwrap.py, docker.py), a pool, and leak reaping."""
