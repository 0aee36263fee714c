"""The sandboxes' settings (``sandbox`` in params.yaml): the backend, its engines, and the limits every sandbox
gets. ``Params`` embeds ``SandboxParams`` as is; a ``SandboxParams`` is the ``Limits`` the sandboxes get."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trialforge.sandbox.base import Limits
from trialforge.sandbox.container.endpoints import EngineEndpoint
from trialforge.sandbox.container.registry import RegistryParams
from trialforge.sandbox.pool import ElasticConfig


class SandboxParams(Limits):
    backend: Literal["bwrap", "docker"] = "bwrap"
    docker_host: str = ""  # empty: DOCKER_HOST, else a local Podman service started on demand
    # docker backend on several engines at once (placement by free capacity and image locality, failover);
    # when set, docker_host must be empty
    engines: list[EngineEndpoint] = []
    engine_health_s: float = Field(5.0, gt=0)  # how often every engine of a fleet is pinged
    registry: RegistryParams = RegistryParams()  # images between engines: pushed once, pulled by the others

    @model_validator(mode="after")
    def _one_way_to_name_engines(self) -> SandboxParams:
        if not self.engines:
            return self
        if self.backend != "docker":
            raise ValueError("sandbox.engines needs sandbox.backend: docker")
        if self.docker_host:
            raise ValueError("set sandbox.docker_host or sandbox.engines, not both")
        labels = [e.label for e in self.engines]
        if len(set(labels)) != len(labels):
            raise ValueError(f"sandbox.engines: two engines share a name or url: {labels}")
        return self

    # Docker without userns-remap would run the sandbox's uid 1000 as host uid 1000: refused unless accepted here
    allow_host_uids: bool = False
    # no cgroup to limit sandboxes with (a normal user without a delegated one; rootless Podman on cgroup v1):
    # refused unless accepted here (bwrap then falls back to per-process rlimits)
    allow_unlimited: bool = False
    # cpus, memory_mb, pids, disk_mb, exec_timeout_s, episode_timeout_s, output_cap_bytes, network: ``Limits``
    concurrency: int = 2  # episodes (and validations) run at once by one process
    max_live: int = Field(16, ge=1)  # sandboxes one process holds at once, episodes' and warm ones
    warm: int = Field(0, ge=0)  # idle sandboxes kept for the next episode (reset, not restarted); 0: always fresh
    warm_lifetime_s: float = Field(3600.0, gt=0)  # a reusable sandbox's deadline (reapers remove it after)
    elastic: ElasticConfig = ElasticConfig()  # warm capacity that follows demand instead of `warm`
