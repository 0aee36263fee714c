"""Environment images: a base image plus what one repository's code needs, built from its ``EnvSpec``.

Built once per spec digest and base image into ``CACHE/envs/KEY`` (the base image's layout), named
``localhost/trialforge-env:KEY``, in a bubblewrap chroot as root with the network (a spec is operator input, like a
Dockerfile), then sealed; what pip resolved is frozen into ``lock.txt`` (the build requirements, installed apart in
``BUILD_ENV``, into ``build-lock.txt``). Rollouts and grading never install anything. docs/environments.md, "Images".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trialforge.envspec import BUILD_ENV, EnvSpec
from trialforge.errors import SandboxError
from trialforge.funnel import Funnel
from trialforge.sandbox.base import Backend
from trialforge.sandbox.images import (
    ENV_REPO,
    Image,
    base_image,
    base_key,
    build_lock,
    cache_root,
    cached_image,
    find_image,
    seal,
    sha256_file,
)
from trialforge.store.objstore import ObjectStore
from trialforge.tasks.envdetect.decide import EnvError
from trialforge.tasks.envdetect.resolve import resolve_env
from trialforge.tasks.schema import Task
from trialforge.tasks.setupeval import setup_arguments
from trialforge.tasks.snapshots import SnapshotStore

log = logging.getLogger(__name__)

KEY_CHARS = 16
LOCK_DIR = "usr/share/trialforge"
_IN_IMAGE = {"lock.txt": "requirements.lock", "build-lock.txt": "build-requirements.lock"}  # their names in LOCK_DIR
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
# Only these reach the build from the caller's environment: a proxy may be how the index is reached.
_PASSED_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
_BUILD_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
    "PIP_NO_CACHE_DIR": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_BREAK_SYSTEM_PACKAGES": "1",  # the image is this one program's: no system Python to protect
    "PIP_ROOT_USER_ACTION": "ignore",
    "PYTHONDONTWRITEBYTECODE": "1",
}


@dataclass(frozen=True)
class BuiltImage:
    image: Image
    spec: EnvSpec
    built: bool  # False: taken from the cache
    seconds: float
    lock: str  # pip freeze of the image: the resolved pins
    build_lock: str = ""  # pip freeze of its build requirements (BUILD_ENV), where the spec has any


def env_key(spec: EnvSpec) -> str:
    """The image's tag and cache directory: what goes into it (the spec's digest) and what it is built on (the base
    image's key), so a new base never reuses an environment image built on the old one."""
    return hashlib.sha256(f"{spec.digest()}\0{base_key(spec.suite)}".encode()).hexdigest()[:KEY_CHARS]


def image_name(spec: EnvSpec) -> str:
    return f"{ENV_REPO}:{env_key(spec)}"


def env_image(spec: EnvSpec, cache_dir: Path | None = None, *, timeout_s: float = 1800.0) -> BuiltImage:
    """The image ``spec`` needs, built first when absent: the base image itself for a spec that adds nothing."""
    start = time.monotonic()
    if spec.is_base():
        return BuiltImage(base_image(cache_dir), spec, False, 0.0, "")
    home = (cache_dir or cache_root()) / "envs" / env_key(spec)
    built = False
    if not (home / "digest").exists():
        with build_lock(home):
            if not (home / "digest").exists():
                _build(spec, base_image(cache_dir, suite=spec.suite), home, timeout_s)
                built = True
    locks = ((home / n).read_text() if (home / n).exists() else "" for n in ("lock.txt", "build-lock.txt"))
    return BuiltImage(cached_image(image_name(spec), home), spec, built, round(time.monotonic() - start, 3), *locks)


def _build(spec: EnvSpec, base: Image, home: Path, timeout_s: float) -> None:
    log.info("building environment image", extra={"image": image_name(spec), "base": base.name})
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home.parent, prefix=f".build-{home.name}-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(["cp", "-a", "--reflink=auto", str(base.rootfs), str(rootfs)], check=True)
        deadline = time.monotonic() + timeout_s
        for argv, what in _steps(spec):
            _run(rootfs, argv, deadline, spec, what)
        locks = {"lock.txt": _run(rootfs, ["python3", "-m", "pip", "freeze", "--all"], deadline, spec)}
        if spec.build_requirements:
            freeze = ["python3", "-m", "pip", "freeze", "--all", "--path", BUILD_ENV]
            locks["build-lock.txt"] = _run(rootfs, freeze, deadline, spec)
        (rootfs / LOCK_DIR).mkdir(parents=True, exist_ok=True)
        home.mkdir(parents=True, exist_ok=True)
        (home / "spec.json").write_text(json.dumps(spec.model_dump(mode="json"), indent=2, sort_keys=True))
        for name, lock in locks.items():
            (rootfs / LOCK_DIR / _IN_IMAGE[name]).write_text(lock)
            (home / name).write_text(lock)
        seal(rootfs, home)


def _steps(spec: EnvSpec) -> list[tuple[list[str], str]]:
    """What the build runs, in order, as argument lists (the spec's install commands are shell by nature), each with
    what it is for where a failure needs saying so."""
    steps: list[tuple[list[str], str]] = []
    if spec.system_packages:
        steps.append((["apt-get", "update", "-q"], ""))
        steps.append((["apt-get", "install", "-y", "-q", "--no-install-recommends", *spec.system_packages], ""))
        steps.append((["apt-get", "clean"], ""))  # the downloaded packages: 75 MB of a compiler's image
    if spec.build_requirements:  # apart, as pip's isolated build has them: not the base image's setuptools
        pip = ["python3", "-m", "pip", "install", "-q", "--target", BUILD_ENV, *spec.pip_args, *spec.build_requirements]
        steps.append((pip, f"what building the extensions requires, on Python {spec.python}"))
    if spec.requirements:
        steps.append((["python3", "-m", "pip", "install", "-q", *spec.pip_args, *spec.requirements], ""))
    steps += [(["/bin/sh", "-ec", command], "") for command in spec.install]
    return steps


def _run(rootfs: Path, argv: list[str], deadline: float, spec: EnvSpec, what: str = "") -> str:
    if shutil.which("bwrap") is None:
        raise SandboxError("bubblewrap is not installed: apt-get install bubblewrap", cause="missing_bwrap")
    if os.geteuid() != 0:
        raise SandboxError("building an environment image needs root (packages install as root)", cause="image")
    binds = ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"] if Path("/etc/resolv.conf").exists() else []
    env = _BUILD_ENV | {k: v for k, v in os.environ.items() if k in _PASSED_ENV}
    if Path(HOST_CA).is_file():  # the host's trust store reaches the index as the host does (a TLS proxy's CA)
        binds += ["--ro-bind", HOST_CA, "/tmp/host-ca.crt"]
        env |= {"PIP_CERT": "/tmp/host-ca.crt", "SSL_CERT_FILE": "/tmp/host-ca.crt"}
    bwrap = [
        "bwrap", "--bind", str(rootfs), "/", "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
        *binds,
        "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session",
        "--chdir", "/", "--clearenv", *[a for k, v in env.items() for a in ("--setenv", k, v)], *argv,
    ]  # fmt: skip
    left = deadline - time.monotonic()
    try:
        done = subprocess.run(bwrap, capture_output=True, text=True, timeout=max(left, 1.0), check=False)
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"building {image_name(spec)} timed out at `{' '.join(argv)}`", cause="image") from exc
    if done.returncode != 0:
        tail = (done.stdout[-1500:] + done.stderr[-2500:]).strip()
        why = f" ({what})" if what else ""
        raise SandboxError(
            f"building {image_name(spec)} failed at `{' '.join(argv)}` (exit {done.returncode}){why}:\n{tail}",
            cause="image",
        )
    return done.stdout


def task_image(task: Task, backend: Backend, default: str) -> Image:
    """The image ``task`` runs in: its environment image, checked against its record, else ``default`` (the base).

    A task records the digest of the environment image it was validated in; an image rebuilt since
    (another resolution of its requirements) is not the environment that validation vouched for. A
    base image is built on each machine from its Debian release, so only its name is kept to.
    """
    if not task.image.startswith(ENV_REPO + ":"):
        return backend.image_for(default)
    image = backend.image_for(task.image)
    if task.image_digest and image.digest != task.image_digest:
        raise SandboxError(
            f"task {task.task_id}: image {task.image} is {image.digest} on this machine, but the task was validated "
            f"in {task.image_digest}: validate the task set again (or restore that image)",
            cause="image",
        )
    return image


def provide_images(
    tasks: list[Task],
    snapshots: SnapshotStore,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    timeout_s: float = 1800.0,
    store: ObjectStore | None = None,
) -> tuple[list[Task], Funnel, list[BuiltImage]]:
    """Give every task its environment spec and a built image; return the tasks, the funnel and the images.

    A task without a spec gets the one detected in its base tree (``envdetect.resolve.resolve_env``: the
    repository's files, a computing ``setup.py`` run in a sandbox, its ``trialforge-env.yaml``, then
    ``overrides``, params.yaml's ``env.repos``).
    Each distinct spec is built once and, with ``store``, published there by digest (``publish_image``)
    for the machines that run the tasks later. A task whose spec cannot be resolved or whose image fails
    to build is dropped with the reason; the others go on.
    """
    funnel = Funnel("images")
    detected: dict[tuple[str, str], EnvSpec | EnvError] = {}
    resolved: list[Task] = []
    for task in tasks:
        if task.env is None:
            key = (task.repo, task.snapshot)
            if key not in detected:
                detected[key] = _detect(snapshots.materialize(task.snapshot), task.repo, overrides)
            found = detected[key]
            if isinstance(found, EnvError):
                funnel.drop(task.task_id, "no_environment", str(found))
                continue
            task = task.model_copy(update={"env": found})
        resolved.append(task)
    built: dict[str, BuiltImage | SandboxError] = {}
    for task in resolved:
        assert task.env is not None
        digest = task.env.digest()
        if digest not in built:
            try:
                built[digest] = env_image(task.env, timeout_s=timeout_s)
                if store is not None and not task.env.is_base():
                    publish_image(store, built[digest].image)
            except SandboxError as exc:
                log.warning("environment image build failed", extra={"image": image_name(task.env), "error": str(exc)})
                built[digest] = exc
    provided = []
    for task in resolved:
        assert task.env is not None
        image = built[task.env.digest()]
        if isinstance(image, SandboxError):
            funnel.drop(task.task_id, "image_build_failed", str(image))
            continue
        funnel.keep()
        provided.append(task.model_copy(update={"image": image.image.name, "image_digest": image.image.digest}))
    return provided, funnel, [b for b in built.values() if isinstance(b, BuiltImage)]


def _detect(tree: Path, repo: str, overrides: Mapping[str, Mapping[str, Any]] | None) -> EnvSpec | EnvError:
    try:
        return resolve_env(tree, repo, overrides, evaluate=setup_arguments)
    except EnvError as exc:
        return exc


# --- images by digest, through the object store --------------------------------------------------------


def image_key(digest: str) -> str:
    return f"images/{digest.removeprefix('sha256:')}.tar"


def publish_image(store: ObjectStore, image: Image) -> str:
    """Put ``image``'s tarball in ``store`` under its content digest (once: the key names the content)."""
    key = image_key(image.digest)
    if not store.exists(key):
        store.put_file(key, image.tarball)
    return key


def obtain_images(store: ObjectStore, tasks: Iterable[Task], cache_dir: Path | None = None) -> None:
    """Make every environment image ``tasks`` name present here: a machine that did not build one (a Ray node,
    a fresh worker) takes it from ``store`` by the digest the task recorded, and checks the content against it."""
    wanted = {(t.image, t.image_digest) for t in tasks if t.image.startswith(ENV_REPO + ":") and t.image_digest}
    for name, digest in sorted(wanted):
        try:
            find_image(name, cache_dir)
        except SandboxError:
            _fetch(store, name, digest, (cache_dir or cache_root()) / "envs" / name.rpartition(":")[2])


def _fetch(store: ObjectStore, name: str, digest: str, home: Path) -> None:
    key = image_key(digest)
    if not store.exists(key):
        raise SandboxError(
            f"image {name} ({digest}) is neither built here nor published in the store: run `trialforge image "
            "build --tasks` where the task set was made",
            cause="image",
        )
    with build_lock(home):
        if (home / "digest").exists():
            return
        with tempfile.TemporaryDirectory(dir=home.parent, prefix=f".fetch-{home.name}-") as tmp:
            tarball = Path(tmp) / "rootfs.tar"
            store.get_file(key, tarball)
            got = "sha256:" + sha256_file(tarball)
            if got != digest:
                raise SandboxError(f"image {name} from {store.uri(key)} is {got}, not {digest}", cause="image")
            rootfs = Path(tmp) / "rootfs"
            rootfs.mkdir()
            subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-xf", str(tarball)], check=True)
            home.mkdir(parents=True, exist_ok=True)
            rootfs.rename(home / "rootfs")
            tarball.rename(home / "rootfs.tar")
            (home / "digest").write_text(digest.removeprefix("sha256:"))
    log.info("environment image fetched", extra={"image": name, "digest": digest})
