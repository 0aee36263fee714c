"""Curation's settings (``curate`` in params.yaml): how tasks are split, decontaminated and sampled.
``Params`` embeds ``CurateParams`` as is; a ``CurateParams`` is the ``SplitConfig`` of ``curate.splits`` and the
``DecontamConfig`` of ``curate.decontam``."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator

from trialforge.curate.sampler import SamplerConfig
from trialforge.section import Section


class SplitConfig(Section):
    """Which tasks are held out (``curate.splits.assign_splits``)."""

    eval_fraction: float = Field(0.0, ge=0.0, lt=1.0)  # share of tasks held out (never trained on)
    # family: that share of every kind of bug | hash: by task id | repo: whole repositories
    split_by: Literal["repo", "hash", "family"] = "repo"
    split_salt: str = ""


class DecontamConfig(Section):
    """Every knob of decontamination (``curate.decontam``); frozen so an index and its checks agree on it.

    ``exclude_repos``: ``owner/name`` or glob patterns (``owner/*``), case-insensitive.
    """

    ngram_n: int = Field(13, ge=1)  # exact n-gram overlap against references
    shingle_n: int = Field(5, ge=1)  # MinHash-LSH shingles
    num_perm: int = Field(128, ge=16)
    threshold: float = Field(0.7, gt=0.0, le=1.0)  # near-duplicate Jaccard threshold
    exclude_repos: list[str] = []
    cutoff: str | None = None  # ISO date: tasks created after it are excluded (may postdate a model's data)

    @field_validator("cutoff")
    @classmethod
    def _iso(cls, cutoff: str | None) -> str | None:
        if cutoff is not None:
            try:
                datetime.fromisoformat(cutoff.strip())
            except ValueError:
                raise ValueError(f"cutoff {cutoff!r} is not an ISO date, e.g. '2024-01-31'") from None
        return cutoff


class CurateParams(SplitConfig, DecontamConfig):
    pass_k: int = Field(2, ge=1)
    sampler: SamplerConfig = SamplerConfig()  # which tasks the learner rolls out each iteration
