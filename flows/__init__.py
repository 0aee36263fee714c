"""Prefect flows: wiring only. Each flow calls trialforge.pipeline's steps and trialforge.orchestrate.

ingest -> curate -> (rollout -> train) x iterations, and ``pipeline`` runs them all as subflows.
Entrypoints (prefect.yaml, ``trialforge run``) are ``flows/<name>.py:<name>``, loaded from the repository root.
"""
