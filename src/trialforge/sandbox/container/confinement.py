"""How a container sandbox (the docker backend) is confined: every protection a named step, listed in one place.

``host_config`` assembles them into the Engine API's ``HostConfig``: ``identity`` (a user namespace per container),
``privileges``, ``seccomp`` (``seccomp.py`` as an OCI profile), ``filesystem`` (read-only image, the ``disk.py``
tmpfs places, masked ``/proc``), ``network`` (none unless asked), ``namespaces`` and ``resources``.
``bwrap/confinement.py`` is the bwrap backend's counterpart. docs/security.md, "The docker backend", says each step
in full and maps it to the threat it answers; tests/test_escapes.py and tests/test_sandbox_docker.py hold the
attacks that prove it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trialforge.errors import SandboxError
from trialforge.sandbox import disk
from trialforge.sandbox.base import Limits
from trialforge.sandbox.host.identity import SANDBOX_UID
from trialforge.sandbox.procfs import MASKED_PROC, READONLY_PROC

# runc's and Docker's masked /sys entries: firmware tables, and RAPL energy counters (a side channel).
MASKED_SYS = ("/sys/firmware", "/sys/devices/virtual/powercap")
MASKED_PATHS = (*MASKED_PROC, *MASKED_SYS)
READONLY_PATHS = READONLY_PROC
# Podman: one user-mode network stack per container, which refuses connections to the host's loopback.
PODMAN_NETWORK = "slirp4netns:allow_host_loopback=false,enable_ipv6=false"


@dataclass(frozen=True)
class Engine:
    """What the engine on the other end of the API is, as far as confinement is concerned."""

    podman: bool
    userns_remap: bool = False  # Docker only: the daemon maps every container's uids (``--userns-remap``)

    @classmethod
    def from_api(cls, version: dict[str, Any], info: dict[str, Any]) -> Engine:
        components = version.get("Components") or []
        podman = any("podman" in str(c.get("Name", "")).lower() for c in components)
        remap = any("name=userns" in str(opt) for opt in info.get("SecurityOptions") or [])
        return cls(podman=podman, userns_remap=remap)


def identity(engine: Engine, *, allow_host_uids: bool = False) -> dict[str, Any]:
    if engine.podman:
        return {"UsernsMode": "auto"}
    if engine.userns_remap or allow_host_uids:
        return {}  # the daemon's remapping applies (or the caller accepted host uids)
    raise SandboxError(
        "this Docker daemon runs containers in the host's user namespace: the sandbox's uid 1000 would be "
        "host uid 1000, possibly a real user. Start dockerd with --userns-remap=default, use Podman, "
        "or set sandbox.allow_host_uids: true (params.yaml) to accept that",
        cause="engine",
    )


def privileges() -> dict[str, Any]:
    return {"CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges"]}


def seccomp(profile: str) -> dict[str, Any]:
    """``profile``: a path on the engine's host (Podman) or the JSON itself (Docker)."""
    return {"SecurityOpt": [f"seccomp={profile}"]}


def filesystem(engine: Engine, limits: Limits) -> dict[str, Any]:
    # /work belongs to the sandbox user inside its user namespace: Podman's ``U`` chowns the mount
    # to the container's user; Docker takes the tmpfs's uid/gid options (in-namespace ids).
    owner = "U" if engine.podman else f"uid={SANDBOX_UID},gid={SANDBOX_UID}"
    extra = {disk.WORKDIR: f",{owner}", "/dev/shm": ",noexec"}  # /dev/shm: see ``namespaces``
    config: dict[str, Any] = {"ReadonlyRootfs": True, "Tmpfs": {}}
    for place in disk.places(limits):
        options = place.tmpfs_options() if not engine.podman else f"size={place.size_bytes},mode={place.mode:04o}"
        config["Tmpfs"][place.path] = f"{options},nosuid,nodev{extra.get(place.path, '')}"
    if engine.podman:  # Podman adds these to its defaults (its compat API ignores MaskedPaths)
        config["SecurityOpt"] = ["mask=" + ":".join(MASKED_PATHS)]
    else:  # Docker replaces its defaults with these lists, which include them
        config["MaskedPaths"] = list(MASKED_PATHS)
        config["ReadonlyPaths"] = list(READONLY_PATHS)
    return config


def network(engine: Engine, *, enabled: bool) -> dict[str, Any]:
    if not enabled:
        return {"NetworkMode": "none"}
    return {"NetworkMode": PODMAN_NETWORK if engine.podman else "bridge"}


def namespaces() -> dict[str, Any]:
    return {"IpcMode": "none", "PidMode": "", "UTSMode": ""}


def resources(limits: Limits) -> dict[str, Any]:
    memory = limits.memory_mb * 1024 * 1024
    return {
        "Memory": memory,
        "MemorySwap": memory,
        "PidsLimit": limits.pids,
        "NanoCpus": int(limits.cpus * 1e9),
    }


def host_config(
    engine: Engine,
    limits: Limits,
    *,
    seccomp_profile: str,
    allow_host_uids: bool = False,
) -> dict[str, Any]:
    """The whole ``HostConfig`` of a sandbox container: the steps above, merged (``SecurityOpt`` lists concatenate)."""
    config: dict[str, Any] = {}
    for step in (
        identity(engine, allow_host_uids=allow_host_uids),
        privileges(),
        seccomp(seccomp_profile),
        filesystem(engine, limits),
        network(engine, enabled=limits.network),
        namespaces(),
        resources(limits),
    ):
        for key, value in step.items():
            if key == "SecurityOpt":
                config.setdefault(key, []).extend(value)
            else:
                config[key] = value
    return config
