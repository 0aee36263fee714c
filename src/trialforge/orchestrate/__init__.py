"""Orchestration: where the loop's work runs, and how Prefect sees it. The flows in ``flows/`` are wiring only;
this package holds what they share:

- ``boundary``: the flows' validated parameter types and the results they return;
- ``runners``: where shards run (threads here, or a Ray cluster), with Prefect retries, concurrency limits,
  artifacts and progress;
- ``serve``: the deployments of ``prefect.yaml`` served from one process, and a local Prefect server;
- ``cli``: ``trialforge serve``, ``trialforge flow`` and the servers' commands.

The loop itself (what an iteration does) is ``trialforge.loop``.
"""

from trialforge.orchestrate.boundary import Iteration, RolloutResult, RunId, ShardRunner, ShardSize, TaskSetVersion

__all__ = ["Iteration", "RolloutResult", "RunId", "ShardRunner", "ShardSize", "TaskSetVersion"]
