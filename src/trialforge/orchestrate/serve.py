"""Deployments: ``prefect.yaml`` is the one list of them, whichever way they are run.

``prefect deploy --all`` registers them with a work pool (``prefect worker start`` runs them), and
``trialforge serve`` reads the same file and serves every deployment from one process, no work pool or
worker needed: single-host use. Both need a Prefect server (PREFECT_API_URL).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trialforge.errors import ConfigError


class _Spec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class CronSchedule(_Spec):
    cron: str
    timezone: str = "UTC"


class RunConcurrency(_Spec):
    limit: int = Field(ge=1)
    collision_strategy: Literal["ENQUEUE", "CANCEL_NEW"] = "ENQUEUE"


class DeploymentSpec(_Spec):
    """The part of a ``prefect.yaml`` deployment that serving uses (work pool and pull steps are the worker's)."""

    name: str
    entrypoint: str
    description: str = ""
    tags: list[str] = []
    parameters: dict[str, Any] = {}
    schedules: list[CronSchedule] = []
    concurrency_limit: RunConcurrency | None = None


def read_deployments(project: Path) -> list[DeploymentSpec]:
    try:
        raw = yaml.safe_load(project.read_text()) or {}
        return [DeploymentSpec.model_validate(d) for d in raw.get("deployments", [])]
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ConfigError(f"cannot read the deployments of {project}: {exc}") from exc


def runner_deployments(project: Path, names: list[str] | None = None) -> list[Any]:
    """``RunnerDeployment``s of ``project``'s deployments (all, or those named), ready for ``prefect.serve``."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.flows import load_flow_from_entrypoint
    from prefect.schedules import Cron

    specs = read_deployments(project)
    unknown = sorted(set(names or []) - {s.name for s in specs})
    if unknown:
        raise ConfigError(f"{project} has no deployments {unknown}; it has {[s.name for s in specs]}")
    chosen = [s for s in specs if not names or s.name in names]
    return [
        load_flow_from_entrypoint(str(project.parent / s.entrypoint)).to_deployment(
            name=s.name,
            description=s.description,
            tags=s.tags,
            parameters=s.parameters,
            schedules=[Cron(c.cron, timezone=c.timezone) for c in s.schedules],
            concurrency_limit=ConcurrencyLimitConfig(
                limit=s.concurrency_limit.limit,
                collision_strategy=ConcurrencyLimitStrategy(s.concurrency_limit.collision_strategy),
            )
            if s.concurrency_limit
            else None,
        )
        for s in chosen
    ]


def serve(project: Path, names: list[str] | None = None, limit: int | None = None) -> None:
    """Serve the deployments until interrupted; flow runs start as subprocesses of this one, ``limit`` at a time."""
    from prefect import serve as prefect_serve
    from prefect.settings import get_current_settings

    if not get_current_settings().api.url:
        raise ConfigError("serving needs a Prefect server: start one (`prefect server start`) and set PREFECT_API_URL")
    prefect_serve(*runner_deployments(project, names), limit=limit)
