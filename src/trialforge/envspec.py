"""What a task's code needs to run: the environment spec a per-repository image is built from.

A spec is data, not a Dockerfile: the Python version (which picks the Debian release whose
``python3`` it is), Debian packages, pinned pip requirements, build-time install commands, the
environment variables tests run with and the test command. ``image_digest`` of the built image is
what a task records; ``digest()`` is what the image cache is keyed by (only the fields that change
the image: env vars and the test command act at run time and share one image).

Detection from the repository (``detect``) and per-repository overrides live in
``trialforge.tasks.envdetect``; building in ``trialforge.tasks.envimages``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

# Debian release whose python3 is each version: images for another Python come from that release's packages
# (no interpreter is ever downloaded outside the package registries).
SUITES: dict[str, str] = {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}
DEFAULT_PYTHON = "3.11"
PYTEST_CMD = ("python3", "-m", "pytest")
UNITTEST_CMD = ("python3", "-m", "unittest")
TestRunner = Literal["pytest", "unittest"]
# What compiling a repository's own C extensions needs in its image (Debian names; python3-dev brings the headers
# of the image's own python3): only specs with a ``build`` get them.
BUILD_PACKAGES = ("gcc", "libc6-dev", "python3-dev")
# Where an image holds a spec's build requirements: apart from what the tests import, and all the build sees (as in
# pip's isolated build environment: the base image's Debian packaging 23 would shadow what setuptools 77+ vendors).
BUILD_ENV = "/opt/trialforge/build-env"


class Build(BaseModel):
    """The repository's own extension modules, built in place in a sandbox before its tests run, every time its tree
    changes (``tasks.extbuild``): setuptools' ``build_ext --inplace``, as the repository's ``setup.py`` (or its
    setuptools configuration) declares them, a Cython source compiled to C first. What setuptools said when asked in
    a sandbox (``tasks.setupeval``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    extensions: tuple[str, ...]  # dotted module names the build must produce ("markupsafe._speedups")
    sources: tuple[str, ...] = ()  # their declared sources and depends, relative to the repository root


class EnvSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    python: str = DEFAULT_PYTHON  # major.minor; must be a key of SUITES
    system_packages: tuple[str, ...] = ()  # Debian packages installed at build time
    requirements: tuple[str, ...] = ()  # pip requirement specifiers installed at build time ("name==1.2")
    pip_args: tuple[str, ...] = ()  # extra pip options at build time (an index URL, --find-links, ...)
    install: tuple[str, ...] = ()  # shell commands run at build time, in the image, with the network
    env: dict[str, str] = Field(default_factory=dict)  # environment of every test run (e.g. PYTHONPATH)
    test_cmd: tuple[str, ...] = PYTEST_CMD  # how the suite is run: pytest or unittest, with their options
    build: Build | None = None  # the repository's own extensions, built in each sandbox's tree before its tests
    # what building them needs (pyproject's [build-system] requires, the Cython a .pyx source needs): installed at
    # image build time into BUILD_ENV, the newest release each allows, as pip's isolated build installs them
    build_requirements: tuple[str, ...] = ()
    detected_from: tuple[str, ...] = ()  # the files (or override) each value came from: provenance only

    @model_serializer(mode="wrap")
    def _no_build_unsaid(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """A spec without a build serializes as it did before there were builds: stored tasks keep their hashes."""
        data = handler(self)
        if self.build is None:
            data.pop("build", None)
        if not self.build_requirements:
            data.pop("build_requirements", None)
        return data

    @field_validator("python")
    @classmethod
    def _known_python(cls, value: str) -> str:
        if value not in SUITES:
            known = ", ".join(f"{v} ({s})" for v, s in SUITES.items())
            raise ValueError(f"no image for Python {value}: images exist for {known}")
        return value

    @property
    def suite(self) -> str:
        return SUITES[self.python]

    @property
    def runner(self) -> TestRunner:
        """Which runner ``test_cmd`` invokes (a command that is neither is refused at construction)."""
        return runner_of(self.test_cmd)

    def image_fields(self) -> dict[str, object]:
        fields: dict[str, object] = {
            "python": self.python,
            "system_packages": sorted(self.system_packages),
            "requirements": sorted(self.requirements),
            "pip_args": list(self.pip_args),
            "install": list(self.install),
        }
        if self.build_requirements:  # only then: images built before there were any keep their keys
            fields["build_requirements"] = list(self.build_requirements)
        return fields

    def digest(self) -> str:
        """sha256 over what goes into the image: two specs with the same one share an image."""
        return hashlib.sha256(json.dumps(self.image_fields(), sort_keys=True).encode()).hexdigest()

    def is_base(self) -> bool:
        """Nothing beyond the base image: the bundled repositories' case, no build needed."""
        extra = self.system_packages or self.requirements or self.build_requirements or self.install
        return self.python == DEFAULT_PYTHON and not extra

    @field_validator("test_cmd")
    @classmethod
    def _known_runner(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        runner_of(value)
        return value


def runner_of(cmd: tuple[str, ...] | list[str]) -> TestRunner:
    """``pytest`` or ``unittest`` for a test command that runs one of them; ValueError names what is accepted."""
    argv = list(cmd)
    if argv[:1] == ["pytest"] or argv[:3] == list(PYTEST_CMD) or argv[:3] == ["python", "-m", "pytest"]:
        return "pytest"
    if argv[:3] == list(UNITTEST_CMD) or argv[:3] == ["python", "-m", "unittest"]:
        return "unittest"
    raise ValueError(
        f"test command {argv!r} runs neither pytest nor unittest: use `python3 -m pytest [options]`, "
        "`pytest [options]` or `python3 -m unittest [options]` (tests run under trialforge's recorder)"
    )


def runner_args(cmd: tuple[str, ...] | list[str]) -> list[str]:
    """The options after the runner in ``cmd`` (``python3 -m pytest -p xdist`` -> ``["-p", "xdist"]``)."""
    argv = list(cmd)
    return argv[1:] if argv[:1] == ["pytest"] else argv[3:]
