"""Every experiment knob, read from params.yaml (the same file DVC tracks as params).

Unknown keys are errors: a typo in params.yaml must not silently fall back to a default.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from trialforge.curate.settings import CurateParams
from trialforge.errors import ConfigError
from trialforge.quality.settings import QualityConfig
from trialforge.rollout.settings import RolloutParams
from trialforge.sandbox.settings import SandboxParams
from trialforge.section import Section
from trialforge.tasks.settings import EnvParams, SourceParams, ValidateConfig
from trialforge.train.health import HealthThresholds, LearningGate
from trialforge.train.settings import TrainParams
from trialforge.verify.settings import VerifyConfig


class RunParams(Section):
    name: str = "demo"
    seed: int = 0
    store: str = "file://.trialforge/store"  # file://PATH (relative to the working directory) or s3://bucket/prefix
    out_dir: str = "out"


class Prices(Section):
    """What a unit costs, for the cost figures (``observe.cost``); 0 leaves that part unpriced."""

    cpu_hour: float = Field(0.0, ge=0)  # per reserved CPU-hour of sandboxes
    memory_gb_hour: float = Field(0.0, ge=0)  # per reserved GB-hour of sandbox memory
    gpu_hour: float = Field(0.0, ge=0)  # per GPU-hour of the trainer's updates on CUDA
    per_million_tokens: float = Field(0.0, ge=0)  # policy tokens, prompt and completion
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$")


class ObserveParams(HealthThresholds):
    # max_env_error_rate, max_verifier_error_rate: ``HealthThresholds`` (did the environment break?)
    learning: LearningGate = LearningGate()  # the learner's checks: is there anything to learn from the batch?
    prices: Prices = Prices()  # never part of a run's digest: pricing changes no result


class TrackingParams(Section):
    """Experiment tracking with MLflow (``observe.tracking``): never part of a run's digest, never a reason to rerun."""

    enabled: bool = True
    # "": a SQLite store inside the run's file store (STORE/mlflow/mlflow.db, offline); sqlite:///PATH.db, an
    # http(s):// tracking server, or any other MLflow tracking URI. MLFLOW_TRACKING_URI, when set, overrides it.
    uri: str = ""
    experiment: str = ""  # "": run.name

    @field_validator("uri")
    @classmethod
    def _uri(cls, uri: str) -> str:
        if uri and uri != "databricks" and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:\S*", uri):
            raise ValueError(
                f"{uri!r} is not a tracking URI: sqlite:///PATH.db for a local store, http://HOST:PORT for a "
                'tracking server, or "" for the default (a SQLite store inside the run\'s store)'
            )
        return uri


class EnvServerParams(Section):
    """`trialforge serve env`: tasks as online environments for external trainers (docs/env-server.md)."""

    host: str = "127.0.0.1"  # loopback unless told otherwise: anything else is a deliberate choice
    port: int = Field(8765, ge=0, le=65535)  # 0: any free port (the server prints it)
    tasks: str = ""  # a task set (Parquet); "": the last run's, OUT_DIR/tasks/taskset.parquet
    splits: list[Literal["train", "eval"]] = ["train"]  # what clients may reset into; eval only on purpose
    max_live: int = Field(16, ge=1)  # episodes at once; more resets get 429 with Retry-After
    idle_timeout_s: float = Field(120.0, gt=0)  # a client silent this long loses its episode (policy_error)
    verdict_ttl_s: float = Field(600.0, gt=0)  # an ended episode's verdict stays readable this long
    flush_every: int = Field(16, ge=1)  # ended episodes written to the store together (also every 5 s)
    max_body_kb: int = Field(1024, ge=1)  # a request body over this is refused (413)
    token_env: str = "TRIALFORGE_ENV_TOKEN"  # the variable holding the bearer token; unset: one is generated

    @field_validator("splits")
    @classmethod
    def _splits(cls, splits: list[str]) -> list[str]:
        if not splits:
            raise ValueError("serve at least one split (train, eval)")
        return splits


class Params(Section):
    run: RunParams = RunParams()
    sources: SourceParams = SourceParams()
    env: EnvParams = EnvParams()
    sandbox: SandboxParams = SandboxParams()
    validate_: ValidateConfig = Field(ValidateConfig(), alias="validate")
    verify: VerifyConfig = VerifyConfig()
    curate: CurateParams = CurateParams()
    quality: QualityConfig = QualityConfig()
    rollout: RolloutParams = RolloutParams()
    train: TrainParams = TrainParams()
    observe: ObserveParams = ObserveParams()
    tracking: TrackingParams = TrackingParams()
    env_server: EnvServerParams = EnvServerParams()

    def digest(self) -> str:
        """Hash of every knob: recorded on each episode row so a result names the settings that made it.
        (Where a run is tracked or served, what its resources are priced at, when its sandboxes start and on which
        engines change nothing it computes: ``tracking``, ``env_server``, ``observe.prices`` and ``sandbox``'s
        ``elastic``, ``engines``, ``engine_health_s`` and ``registry`` are left out.)"""
        placement = dict.fromkeys(("elastic", "engines", "engine_health_s", "registry"), True)
        knobs = {"tracking": True, "env_server": True, "observe": {"prices": True}, "sandbox": placement}
        blob = json.dumps(self.model_dump(mode="json", by_alias=True, exclude=knobs), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _merged(old: Any, new: Any) -> Any:
    """``new`` over ``old``: a mapping overrides key by key (``{"sources": {"extra": []}}`` keeps the other sources)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **{key: _merged(old.get(key), value) for key, value in new.items()}}
    return new


def load_params(path: Path | None = None, overrides: dict | None = None) -> Params:
    """Read params.yaml (defaults when absent) with optional nested overrides."""
    data: dict = {}
    if path is not None and path.exists():
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _merged(node.get(leaf), value)
    try:
        return Params.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid parameters in {path or 'defaults'}: {problems}") from exc
