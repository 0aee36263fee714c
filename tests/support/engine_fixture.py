"""pytest plugin: one container engine per test session, for every test that needs the docker backend.

Starts a private ``podman system service`` once (or uses ``DOCKER_HOST`` when the
user has a Docker), imports the base image into it if needed, and at teardown
removes every sandbox this session created (and any left by dead owners) before
stopping the service. Register with ``pytest_plugins = ["support.engine_fixture"]``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import docker
import pytest

from trialforge.errors import SandboxError
from trialforge.sandbox.container.backend import DockerBackend, owner_label
from trialforge.sandbox.container.engine import PodmanService
from trialforge.sandbox.host.leftovers import reap_containers
from trialforge.sandbox.images import base_image


@pytest.fixture(scope="session")
def container_engine() -> Iterator[PodmanService]:
    """The engine for this session: our own Podman service, or the user's DOCKER_HOST."""
    if not os.environ.get("DOCKER_HOST") and shutil.which("podman") is None:
        pytest.skip("no container engine: install podman (apt-get install podman runc) or set DOCKER_HOST")
    service = PodmanService()
    service.start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="session")
def docker_client(container_engine: PodmanService) -> Iterator[docker.DockerClient]:
    client = container_engine.client()
    try:
        yield client
    finally:
        try:
            reap_containers(client, owner=owner_label())
        finally:
            client.close()


@pytest.fixture(scope="session")
def docker_backend(docker_client: docker.DockerClient, container_engine: PodmanService) -> Iterator[DockerBackend]:
    """A DockerBackend over the base image, imported into the engine once per machine."""
    try:
        image = base_image(build=False)
    except SandboxError as exc:
        pytest.skip(f"{exc} (needs debootstrap and a Debian mirror once)")
    backend = DockerBackend(docker_client, image, engine_tmp=container_engine.tmp_dir)
    backend.ensure_image()
    try:
        yield backend
    finally:
        backend.close()
