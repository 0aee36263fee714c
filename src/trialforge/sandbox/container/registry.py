"""An image registry between the engines of a fleet (``sandbox.registry``): build once, push once, pull everywhere.

Without a registry every engine imports the image tarball built on this host (uploaded through its API).
With one, the first engine that lacks an image imports the tarball and pushes it; every other engine pulls
it. The tag is the tarball's content digest (``REGISTRY/NAME:sha256-<hex>``), and a pulled image counts only
when its ``trialforge.digest`` label is that digest: the engine runs the content that was built, or the
backend falls back to importing the tarball.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import docker
import docker.errors
from pydantic import BaseModel, ConfigDict, field_validator

from trialforge.sandbox.images import Image

log = logging.getLogger(__name__)


class RegistryParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = ""  # host[:port][/prefix] of a Docker registry (v2 API); empty: no registry, tarballs are imported
    insecure: bool = False  # plain http (a registry on loopback or a trusted network only)

    @field_validator("url")
    @classmethod
    def _no_scheme(cls, url: str) -> str:
        if "://" in url or url.endswith("/"):
            raise ValueError(f"registry url {url!r}: host[:port][/prefix], no scheme, no trailing slash")
        return url

    def reference(self, image: Image) -> str:
        """``REGISTRY/NAME:sha256-<hex>``: one tag per content digest, so a rebuilt image never reuses a tag."""
        repo = re.sub(r"[^a-z0-9._/-]", "-", image.name.split(":", 1)[0].removeprefix("localhost/").lower())
        return f"{self.url}/{repo}:{image.digest.replace(':', '-')}"


def pull(api: docker.APIClient, registry: RegistryParams, image: Image, *, podman: bool) -> bool:
    """Pull ``image``'s reference from the registry; False when the registry does not have it (or cannot be read).

    Podman's Docker-compatible pull has no ``tlsVerify``: its own endpoint does.
    """
    ref = registry.reference(image)
    try:
        if podman:
            params = {"reference": ref, "tlsVerify": str(not registry.insecure).lower()}
            response = api._post(api._url("/libpod/images/pull"), params=params, stream=True)
        else:
            repo, tag = ref.rsplit(":", 1)
            response = api._post(api._url("/images/create"), params={"fromImage": repo, "tag": tag}, stream=True)
        api._raise_for_status(response)
        if error := _stream_error(api, response):
            log.info("image not in the registry", extra={"reference": ref, "error": error})
            return False
    except docker.errors.APIError as exc:
        log.info("image not pulled from the registry", extra={"reference": ref, "error": str(exc)})
        return False
    return True


def push(api: docker.APIClient, registry: RegistryParams, image: Image, image_id: str) -> None:
    """Tag ``image_id`` with its registry reference and push it (a failure is logged: engines can still import)."""
    ref = registry.reference(image)
    repo, tag = ref.rsplit(":", 1)
    try:
        api.tag(image_id, repo, tag)
        params = {"tag": tag, "tlsVerify": str(not registry.insecure).lower()}  # Podman reads it; Docker ignores it
        response = api._post(
            api._url("/images/{0}/push", repo), params=params, headers={"X-Registry-Auth": "e30="}, stream=True
        )
        api._raise_for_status(response)
        if error := _stream_error(api, response):
            log.warning("image push failed", extra={"reference": ref, "error": error})
            return
        log.info("image pushed", extra={"reference": ref})
    except docker.errors.APIError as exc:
        log.warning("image push failed", extra={"reference": ref, "error": str(exc)})


def _stream_error(api: docker.APIClient, response: Any) -> str:
    """The error a streamed pull or push reported in its body (the HTTP status is 200 either way), or ""."""
    for event in api._stream_helper(response, decode=True):
        if isinstance(event, dict) and event.get("error"):
            return str(event["error"])
    return ""
