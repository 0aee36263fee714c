"""Train: one update of the learner over an iteration's published episodes, checkpointed to the store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow

from trialforge.config import load_params
from trialforge.loop.iteration import train_iteration
from trialforge.loop.records import TrainResult
from trialforge.observe.logs import train_done
from trialforge.orchestrate import Iteration, RunId, runners


@flow(name="train", log_prints=True)
def train(
    run_id: RunId,
    iteration: Iteration = 0,
    params_path: str = "params.yaml",
    overrides: dict[str, Any] | None = None,
    checkpoint: str | None = None,
) -> TrainResult:
    """``checkpoint``: the learner's latest weights (None: fresh); the iteration's episodes were sampled with
    these, or with up to ``train.max_staleness`` versions before them."""
    params = load_params(Path(params_path), overrides)
    started = time.monotonic()
    with runners.held_runtime(params) as rt:
        result = train_iteration(rt, run_id, iteration, checkpoint)
    train_done(iteration, result.stats, result.resumed, started=started)
    return result
