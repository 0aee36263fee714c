"""From what a repository's files declare to its ``EnvSpec``: the Python, the requirements, the test command.

The Python is the newest Debian ``python3`` that ``requires-python`` allows and the pinned pytest runs on, 3.11 when
it may (where none allowed runs the pin, the pin is relaxed to the oldest release that runs on it); the
requirements are the declared ones that apply under it (runtime, one file or group of test requirements, no
developer tools; the image build records what they resolved to); the test runner and its options come from the
repository's own configuration, and ``PYTHONPATH`` from a ``src/`` layout. A repository the base image already
serves (no requirements, Python 3.11, flat layout) gets a base spec, so no image is built for it.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.markers import default_environment
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from trialforge.envspec import (
    BUILD_PACKAGES,
    DEFAULT_PYTHON,
    PYTEST_CMD,
    SUITES,
    UNITTEST_CMD,
    Build,
    EnvSpec,
    runner_of,
)
from trialforge.errors import TaskError
from trialforge.sandbox.base import WORKDIR
from trialforge.tasks.envdetect.readers import Findings, parse_requirement, read, shell_words, test_styles
from trialforge.tasks.pytestconfig import pytest_option, text_of

log = logging.getLogger(__name__)

DEFAULT_BUILD_REQUIRES = "setuptools>=40.8.0"  # what pip builds a project without [build-system] requires with
OVERRIDE_FILE = "trialforge-env.yaml"  # a repository's own overrides (``resolve``), named where a decision fails
# The python3 each Debian release ships (one per SUITES key): requires-python and markers are judged
# against the interpreter the image really has, so ">=3.9.1" is met by bullseye's 3.9.2.
RELEASED_PYTHON = {"3.9": "3.9.2", "3.11": "3.11.2", "3.13": "3.13.5"}
# The oldest release of a test tool that runs under a Python and every later one, each checked by installing it
# on CPython 3.11 (and the release before it failing as quoted): pytest 6.2.4 "Fixed assertion rewriting on Python
# 3.10" (older ones fail at collection: 'required field "lineno" missing from alias'); 7.3.2 "Support for Python
# 3.12" (older ones warn that ast.Str is deprecated as they rewrite each module, an error for a suite with
# filterwarnings = error). Tools a suite imports or pytest loads, from years-old requirements files: py before
# 1.11.0 shadows the py shim of the pytest images ship (7.2+) and pytest cannot start ("AttributeError: __spec__"
# from its apipkg); nose before 1.3.7 is Python 2 source that setuptools no longer converts (SyntaxError on import);
# hypothesis before 4.40.0 builds code objects with 3.7's argument list ("code expected at least 16 arguments") or
# imports ABCs from collections; coverage before 4.4 reads opcodes Python 3.8 removed (KeyError 'BREAK_LOOP').
# Oldest Python first: the last that applies is the strictest.
_OLDEST_RUNNING = (
    ("nose", "3.9", "1.3.7"), ("coverage", "3.8", "4.4"), ("hypothesis", "3.8", "4.40.0"),
    ("pytest", "3.10", "6.2.4"), ("py", "3.11", "1.11.0"), ("pytest", "3.12", "7.3.2"),
)  # fmt: skip


class EnvError(TaskError):
    """A repository's environment cannot be resolved: an impossible Python, an invalid override."""


def detect(repo: Path, python: str | None = None, setup_args: Mapping[str, Any] | None = None) -> EnvSpec:
    """The environment ``repo``'s own files declare; ``EnvError`` when no image's Python is allowed by
    ``requires-python``. With ``python`` forced (an override), markers are judged for it, unchecked.
    ``setup_args``: what ``setup.py`` passes to ``setup()``, evaluated in a sandbox (``tasks.setupeval``)."""
    if python is None:
        # Chosen from what holds for any Python, then read again for it: a requirements file may be named for it.
        python, why = _choose_python(read(repo, None, setup_args))
        found = read(repo, python, setup_args)
        why += _relax(found, python)
    else:
        found, why = read(repo, python, setup_args), ()
    root = found.package_root or _src_root(repo, found)
    test_cmd = _test_cmd(repo, found)
    build, build_requirements, build_notes = _build(repo, found)
    return EnvSpec(
        python=python,
        system_packages=BUILD_PACKAGES if build else (),
        requirements=_applicable([text for text, _ in found.requirements], python, found.project),
        pip_args=tuple(found.pip_args),
        env=({"PYTHONPATH": f"{WORKDIR}/{root}"} if root else {}) | found.env,
        test_cmd=test_cmd,
        build=build,
        build_requirements=_applicable(list(build_requirements), python, found.project),
        detected_from=(*found.sources, *why, *build_notes),
    )


def _build(repo: Path, found: Findings) -> tuple[Build | None, tuple[str, ...], tuple[str, ...]]:
    """The repository's own extensions, built in place before its tests (and the toolchain in its image): without
    them its pure-Python fallback would run, and a fix in its C code could never fail a test before it. A Cython
    source (a .pyx, or a .c generated from its .pyx at release time: msgpack's) is built where the repository
    declares Cython; an extension whose sources the tree cannot build is left to the fallback, said so in the
    provenance. Returns the build, what building needs installed (pyproject's ``[build-system] requires``, as pip's
    isolated build installs them, and the declared Cython) and the provenance."""
    kept: dict[str, tuple[str, ...]] = {}
    notes = []
    for name, sources in found.extensions:
        cython = [s for s in sources if _from_pyx(repo, s)]
        missing = [s for s in sources if s not in cython and not (s.startswith("/") or (repo / s).is_file())]
        if missing:
            notes.append(f"setup.py (extension {name} not built: {', '.join(missing)}: not in the tree)")
        elif cython and found.cython is None:
            notes.append(f"setup.py (extension {name} not built: {', '.join(cython)}: Cython, which is not declared)")
        else:
            kept[name] = sources
            if cython:
                notes.append(f"setup.py (extension {name} built from Cython sources: {', '.join(cython)})")
    if not kept:
        return None, (), tuple(notes)
    needs = list(found.build_requires)
    if found.build_requires:
        notes.append(f"pyproject.toml (build-system requires: {', '.join(found.build_requires)})")
    uses_cython = any(_from_pyx(repo, s) for srcs in kept.values() for s in srcs)
    if uses_cython and found.cython is not None and not any(_names(text, "cython") for text in needs):
        text, where = found.cython
        if not needs:  # the build then runs on its requirements alone (extbuild): PEP 518's default backend with it
            needs.append(DEFAULT_BUILD_REQUIRES)
            notes.append(f"setup.py (no build-system requires: {DEFAULT_BUILD_REQUIRES}, pip's default)")
        needs.append(text)
        notes.append(f"{where} (Cython to build .pyx sources: {text})")
    sources = dict.fromkeys(source for srcs in kept.values() for source in srcs)
    return Build(extensions=tuple(kept), sources=tuple(sources)), tuple(needs), tuple(notes)


def _from_pyx(repo: Path, source: str) -> bool:
    """Whether ``source`` is built by Cython: a .pyx in the tree, or a .c absent from it beside its .pyx."""
    path = repo / source
    if source.endswith(".pyx"):
        return path.is_file()
    return source.endswith(".c") and not path.exists() and path.with_suffix(".pyx").is_file()


def _names(text: str, name: str) -> bool:
    req = parse_requirement(text)
    return req is not None and canonicalize_name(req.name) == name


def _choose_python(found: Findings) -> tuple[str, tuple[str, ...]]:
    """3.11 when ``requires-python`` and the pinned test tools allow it, else the newest image Python they
    allow, else 3.11 (or the newest allowed) with the pins relaxed (``_relax``); and, as provenance, the pins
    that ruled out a Python ``requires-python`` allows."""
    candidates = _allowed_pythons(found.python)
    reasons: dict[tuple[str, str], str] = {}  # (file, requirement): why it ruled out the first Python it did
    for version in candidates:
        blockers = _tool_blockers(found.requirements, version)
        if not blockers:
            return version, tuple(
                f"{where} ({text}: {why}: Python {version})" for (where, text), why in reasons.items()
            )
        for where, text, why, _ in blockers:
            reasons.setdefault((where, text), why)
    return candidates[0], ()


def _relax(found: Findings, python: str) -> tuple[str, ...]:
    """Pins of test tools that run on no image Python ``requires-python`` allows (years-old exact pins:
    ``pytest==3.0.7`` cannot start on 3.11), each replaced by the oldest release that runs on ``python``:
    the closest to what the suite was written for. A tool the project itself depends on at run time is left as
    pinned, with a note: what its users install is not the test environment's to change. Returns the provenance
    of each."""
    relaxed: dict[str, str] = {}
    notes = []
    for where, text, why, first in _tool_blockers(found.requirements, python):
        req = parse_requirement(text)
        assert req is not None  # a blocker is a parsed requirement
        if canonicalize_name(req.name) in found.runtime:
            notes.append(f"{where} ({text} not relaxed, a runtime dependency: {why}: Python {python})")
            continue
        req.specifier = SpecifierSet(f"=={first}")
        relaxed[text] = str(req)
        notes.append(f"{where} ({text} relaxed to {req}: {why}: Python {python})")
        log.info("test tool pin relaxed", extra={"pin": text, "relaxed": str(req), "file": where, "python": python})
    found.requirements = [(relaxed.get(text, text), where) for text, where in found.requirements]
    return tuple(notes)


def _allowed_pythons(declared: list[tuple[str, str]]) -> list[str]:
    """The image Pythons every ``requires-python`` allows, 3.11 first, then newest first."""
    allowed = SpecifierSet()
    for text, where in declared:
        try:
            allowed &= SpecifierSet(text)
        except InvalidSpecifier:
            raise EnvError(
                f"requires-python {text!r} in {where} is not a PEP 440 version specifier: "
                f"set `python:` in {OVERRIDE_FILE} or params.yaml env.repos"
            ) from None
    preferred = dict.fromkeys((DEFAULT_PYTHON, *sorted(SUITES, key=Version, reverse=True)))
    versions = [version for version in preferred if allowed.contains(RELEASED_PYTHON[version])]
    if versions:
        return versions
    stated = "; ".join(f"{text!r} in {where}" for text, where in declared)
    available = ", ".join(f"{v} (Debian {s}, python3 {RELEASED_PYTHON[v]})" for v, s in SUITES.items())
    raise EnvError(
        f"requires-python {stated} allows none of the Pythons images exist for: {available}; "
        f"set `python:` in {OVERRIDE_FILE} or params.yaml env.repos to run it under one anyway"
    )


def _tool_blockers(requirements: list[tuple[str, str]], python: str) -> list[tuple[str, str, str, str]]:
    """(file, requirement, why, the first release that runs) for each requirement that allows no release of its
    tool that runs under ``python``."""
    marker_env = _marker_env(python)
    oldest = {tool: (since, first) for tool, since, first in _OLDEST_RUNNING if Version(python) >= Version(since)}
    blockers = []
    for text, where in requirements:
        req = parse_requirement(text)
        if req is None or (req.marker is not None and not req.marker.evaluate(marker_env)):
            continue
        since, first = oldest.get(canonicalize_name(req.name), ("", ""))
        if first and not _allows_from(req.specifier, Version(first)):
            why = f"no {req.name} it allows runs on Python {since}+, {first} is the first"
            blockers.append((where, text, why, first))
    return blockers


def _allows_from(specifier: SpecifierSet, oldest: Version) -> bool:
    """Whether ``specifier`` allows a version at or after ``oldest``: none of its upper bounds is below it."""
    for spec in specifier:
        operator, text = spec.operator, spec.version
        if operator == "~=":  # ~=6.2.1 is ==6.2.*, ~=6.2 is ==6.*
            operator, text = "==", text.rsplit(".", 1)[0] + ".*"
        if operator == "==" and text.endswith(".*"):  # below the next release of the prefix: ==6.2.* is <6.3
            *head, last = Version(text[:-2]).release
            operator, text = "<", ".".join(map(str, (*head, last + 1)))
        if (operator == "<" and Version(text) <= oldest) or (operator in ("<=", "==") and Version(text) < oldest):
            return False
    return True


def _marker_env(python: str) -> dict[str, str]:
    """Marker values in the image of ``python``: it runs Linux on this machine's architecture, so only the
    Python differs from the host."""
    released = RELEASED_PYTHON[python]
    return default_environment() | {
        "python_version": python,
        "python_full_version": released,
        "implementation_version": released,
        "extra": "",
    }


def _applicable(declared: list[str], python: str, project: str | None) -> tuple[str, ...]:
    """The declared requirements that apply under ``python``, once each, in order, as written."""
    marker_env = _marker_env(python)
    kept: list[str] = []
    seen: set[str] = set()
    for text in declared:
        req = parse_requirement(text)
        if req is not None:
            if req.marker is not None and not req.marker.evaluate(marker_env):
                continue
            name = canonicalize_name(req.name)
            # The repository itself is at /work on the path; every base image ships Debian's pytest,
            # so an unversioned pytest would only force an image build (a plugin or a pinned pytest stays).
            if name == project or (name == "pytest" and not req.specifier):
                continue
        key = str(req) if req is not None else text
        if key not in seen:
            seen.add(key)
            kept.append(text)
    return tuple(kept)


def _test_cmd(repo: Path, found: Findings) -> tuple[str, ...]:
    """The runner command, with the repository's own pytest ``addopts`` when it runs pytest: the recorder runs
    with ``-o addopts=`` (so that every option passes through ``testrun.command``'s rules), and a suite's
    ``addopts`` is how its authors run it (click's ``-m 'not stress'`` leaves out 31,000 stress cases)."""
    cmd = _runner_cmd(repo, found)
    addopts = _pytest_addopts(repo, found) if runner_of(cmd) == "pytest" else []
    return (*cmd, *addopts)


def _pytest_addopts(repo: Path, found: Findings) -> list[str]:
    """``addopts`` of the file pytest takes its configuration from (``pytestconfig.pytest_option``)."""
    setting = pytest_option(lambda name: text_of(repo / name), "addopts")
    if setting is None:
        return []
    name, value = setting
    args = [str(a) for a in value] if isinstance(value, list) else shell_words(str(value))
    if args:
        found.note(name, f"pytest addopts: {shlex.join(args)}")
    return args


def _runner_cmd(repo: Path, found: Findings) -> tuple[str, ...]:
    """A command the repository spells out, else pytest when anything points at it, else what the tests use."""
    if found.test_cmd:
        return found.test_cmd
    if found.pytest_config or any(_is_pytest(text) for text, _ in found.requirements):
        return PYTEST_CMD
    unittest_files = []
    for path, style in test_styles(repo):
        if style == "pytest":
            found.source(path)
            return PYTEST_CMD
        if style == "unittest":
            unittest_files.append(path)
    if unittest_files:
        found.source("test files (unittest.TestCase only)")
        return UNITTEST_CMD + _discovery(repo, unittest_files)
    return PYTEST_CMD


def _discovery(repo: Path, files: list[str]) -> tuple[str, ...]:
    """Plain ``python -m unittest`` only descends into packages: tests in one plain directory (no
    ``__init__.py``) are discovered from there, as their authors run them."""
    tops = {f.split("/", 1)[0] for f in files if "/" in f}
    if len(tops) == 1 and all("/" in f for f in files):
        (top,) = tops
        if not (repo / top / "__init__.py").exists():
            return ("discover", "-s", top)
    return ()


def _is_pytest(text: str) -> bool:
    req = parse_requirement(text)
    return req is not None and canonicalize_name(req.name).startswith("pytest")


def _src_root(repo: Path, found: Findings) -> str | None:
    """``src`` for a ``src/`` holding a package or module that the repository root does not also hold."""
    src = repo / "src"
    if not src.is_dir() or (src / "__init__.py").exists():  # src itself a package: imported from the root
        return None
    code = {p.stem for p in src.iterdir() if p.suffix == ".py" or (p.is_dir() and any(p.glob("*.py")))}
    if any(not (repo / name).exists() and not (repo / f"{name}.py").exists() for name in code):
        found.source("src/")
        return "src"
    return None
