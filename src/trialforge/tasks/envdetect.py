"""A repository's environment spec, read from its own files, then its per-repository overrides.

Nothing in the repository is executed: ``pyproject.toml`` and ``setup.cfg`` are parsed,
``setup.py`` is read as a syntax tree (literal arguments only), requirements files, ``tox.ini``
and ``Makefile`` as text. What they declare becomes an :class:`EnvSpec`: the Python (the newest
Debian ``python3`` that ``requires-python`` allows and the pinned pytest runs on, 3.11 when it may), the
requirements as declared (the runtime ones, one file or group of test requirements, no developer tools;
the image build records what they resolved to), the test runner and its options, and ``PYTHONPATH`` for a
``src/`` layout. A repository the base image already serves (no requirements, Python 3.11, flat layout)
gets a base spec, so no image is built for it.

Overrides, later winning per key: the repository's own ``trialforge-env.yaml``, then params.yaml's
per-repository ``env.repos``. SWE-bench instances name the commit whose files define their environment
(``environment_setup_commit``): :func:`spec_at_commit` resolves a commit, :class:`EnvCache` once each.
"""

from __future__ import annotations

import ast
import configparser
import os
import re
import shlex
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import dropwhile
from pathlib import Path
from typing import Any

import yaml
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version
from pydantic import ValidationError

from trialforge import pyast
from trialforge.envspec import DEFAULT_PYTHON, PYTEST_CMD, SUITES, UNITTEST_CMD, EnvSpec, runner_of
from trialforge.errors import TaskError
from trialforge.sandbox.base import WORKDIR
from trialforge.scratch import scratch_dir
from trialforge.tasks.buildfiles import version_file
from trialforge.tasks.ingest.trees import materialize

OVERRIDE_FILE = "trialforge-env.yaml"
PARAMS_SOURCE = "params env.repos"
# The python3 each Debian release ships (one per SUITES key): requires-python and markers are judged
# against the interpreter the image really has, so ">=3.9.1" is met by bullseye's 3.9.2.
RELEASED_PYTHON = {"3.9": "3.9.2", "3.11": "3.11.2", "3.13": "3.13.5"}
TEST_GROUPS = ("test", "tests", "testing")  # extras and dependency groups a test run needs
DEV_GROUP = "dev"  # mostly linters and release tools: read only where no test group exists
OVERRIDABLE = tuple(name for name in EnvSpec.model_fields if name != "detected_from")

# Requirements-file options that reach the image build's pip as written (where packages come from).
_PIP_OPTIONS = frozenset({"-i", "--index-url", "--extra-index-url", "--trusted-host", "-f", "--find-links", "--pre"})
# pytest options whose next token is their value, never a test selection (even when it names a test dir).
_PYTEST_VALUED = frozenset({"--rootdir", "--confcutdir", "--basetemp", "--ignore", "--deselect", "--cov", "-c", "-k"})
_OPTION = re.compile(r"^(--[\w-]+|-\w)\s*=?\s*(.*)$")
_COMMENT = re.compile(r"(^|\s)#.*$")  # pip's rule: a '#' after whitespace (a URL's '#egg=' stays)
_LOCAL = re.compile(r"^(?:\.{1,2}(?:[/\[]|$)|/|file:)")  # the repository or a part of it: it lives at /work
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_FACTOR = re.compile(r"^[\w.,{}!-]+:\s")  # a tox line for some environments only ("py38: mock")
_UNRESOLVED = re.compile(r"\{[^}]*\}|\$[({]")  # tox substitutions and make variables we cannot expand
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_PYTHON = re.compile(r"^(?:.*/)?python[\d.]*$|^\{envpython\}$|^\$[({]PYTHON[)}]$")
_TESTISH = re.compile(r"test|dev")
# A requirements file's purpose, its name less "requirements": "tests", "dev", or "tests" for one Python ("tests37").
_ROLE = re.compile(r"^(?P<role>tests?|testing|dev)(?:[-_]?(?:py)?(?P<major>\d)[._]?(?P<minor>\d+))?$")
_REQUIREMENTS_WORD = re.compile(r"[-_.]?requirements?[-_.]?")
# Developer tools a test run never needs (linters, formatters, type checkers, docs, tox, release tools):
# they only slow and bloat image builds. Names, then prefixes of their plugin and theme families.
_DEV_TOOLS = frozenset(
    {"tox", "pre-commit", "ruff", "mypy", "black", "flake8", "isort", "pylint", "sphinx", "twine", "build"}
)
_DEV_TOOL_FAMILIES = ("sphinx-", "sphinxcontrib-", "tox-", "flake8-", "pre-commit-", "bump")
_IMPORT = re.compile(r"^\s*(?:import|from)\s+(\w+)", re.MULTILINE)
# The oldest release of a test tool that runs under a Python and every later one, from pytest's changelog
# (and checked by running a suite under each): 6.2.4 "Fixed assertion rewriting on Python 3.10" (older ones
# fail at collection: 'required field "lineno" missing from alias'; 6.2.5 declared 3.10 supported);
# 7.3.2 "Support for Python 3.12" (older ones warn that ast.Str is deprecated as they rewrite each module,
# an error for a suite with filterwarnings = error). Oldest Python first: the last that applies is the strictest.
_OLDEST_RUNNING = (("pytest", "3.10", "6.2.4"), ("pytest", "3.12", "7.3.2"))
# Where pytest reads its configuration, in the order it looks (the first with a section wins), and the section.
PYTEST_CONFIGS = (("pytest.ini", "pytest"), (".pytest.ini", "pytest"), ("pyproject.toml", ""), ("tox.ini", "pytest"),
                  ("setup.cfg", "tool:pytest"))  # fmt: skip
_TEST_FILE = re.compile(r"^(?:test_.*|.*_test)\.py$")
_SKIP_DIRS = frozenset({"node_modules", "build", "dist", "venv", "site-packages", "__pycache__"})
_PYTEST_STYLE = re.compile(
    r"^\s*(?:import pytest|from pytest\b|from _pytest\b)|^(?:async )?def test|^class Test\w*(?:\((?:object)?\))?:",
    re.MULTILINE,
)


class EnvError(TaskError):
    """A repository's environment cannot be resolved: an impossible Python, an invalid override."""


@dataclass
class _Findings:
    """What the repository's files declare; markers are judged once a Python is chosen from it."""

    for_python: str | None = None  # the Python a requirements file named for one is picked for, if chosen
    python: list[tuple[str, str]] = field(default_factory=list)  # (requires-python, file)
    requirements: list[tuple[str, str]] = field(default_factory=list)  # (as declared, file), markers not evaluated
    runtime: set[str] = field(default_factory=set)  # what the project itself depends on: never a dropped tool
    pins: dict[tuple[str, str], tuple[Version, str]] = field(default_factory=dict)  # (name, marker): (==, file)
    env: dict[str, str] = field(default_factory=dict)  # for every test run, beside PYTHONPATH
    pip_args: list[str] = field(default_factory=list)
    package_root: str | None = None  # where packages import from when it is not the root ("src")
    test_cmd: tuple[str, ...] | None = None  # a runner command the repository spells out (tox, Makefile)
    pytest_config: bool = False
    project: str | None = None  # the repository's own distribution: never a requirement of itself
    sources: list[str] = field(default_factory=list)
    read_files: set[Path] = field(default_factory=set)  # requirements files, each read once

    def source(self, name: str) -> None:
        if name not in self.sources:
            self.sources.append(name)

    def note(self, where: str, what: str) -> None:
        self.source(f"{where} ({what})")

    def name(self, name: object) -> None:
        if isinstance(name, str) and name and self.project is None:
            self.project = canonicalize_name(name)

    def requires_python(self, spec: object, where: str) -> None:
        if isinstance(spec, str) and spec.strip():
            self.python.append((spec.strip(), where))
            self.source(where)

    def require(self, requirements: Iterable[str], where: str, *, runtime: bool = False) -> None:
        added = []
        for text in filter(None, requirements):
            req = _requirement(text)
            if req is not None and runtime:
                self.runtime.add(canonicalize_name(req.name))
            clash = self._pin_clash(req, where) if req is not None else None
            if clash:
                self.note(where, clash)
            else:
                added.append((text, where))
        self.requirements += added
        if added:
            self.source(where)

    def _pin_clash(self, req: Requirement, where: str) -> str | None:
        """Why ``req`` is left out: an earlier file pins its distribution to another version (pip would
        install neither; the file read first is the one chosen for this run)."""
        pin = next((Version(s.version) for s in req.specifier if s.operator == "==" and "*" not in s.version), None)
        if pin is None:
            return None
        first, first_where = self.pins.setdefault((canonicalize_name(req.name), str(req.marker)), (pin, where))
        return None if first == pin else f"{req} conflicts with =={first} from {first_where}: ignored"

    def version_file(self, repo: Path, path: object, where: str) -> None:
        """A version module the build backend writes from git tags, which a tree from git lacks: said in the
        provenance (ingestion writes a placeholder for pyproject's: ``tasks.buildfiles``)."""
        if isinstance(path, str) and path.strip() and not (repo / path.strip()).exists():
            self.note(where, f"version-file {path.strip()} is generated at build time: not in the tree")

    def pip(self, option: str, value: str, where: str) -> None:
        self.pip_args += [option, value] if value else [option]
        self.source(where)

    def root(self, directory: object, where: str) -> None:
        if isinstance(directory, str) and directory.strip("./ ") and self.package_root is None:
            self.package_root = directory.strip().removeprefix("./").rstrip("/")
            self.source(where)

    def runs(self, cmd: tuple[str, ...] | None, where: str) -> None:
        if cmd and self.test_cmd is None:
            self.test_cmd = cmd
            self.source(where)

    def runs_pytest(self, where: str) -> None:
        self.pytest_config = True
        self.source(where)


def detect(repo: Path) -> EnvSpec:
    """The environment ``repo``'s own files declare; ``EnvError`` when no image's Python is allowed (by
    ``requires-python`` and the pinned pytest)."""
    return _detect(repo, None)


def _detect(repo: Path, python: str | None) -> EnvSpec:
    """``detect``, or with ``python`` forced (an override): then markers are judged for it, unchecked."""
    why: tuple[str, ...] = ()
    if python is None:
        # Chosen from what holds for any Python, then read again for it: a requirements file may be named for it.
        python, why = _choose_python(_read(repo, None))
    found = _read(repo, python)
    root = found.package_root or _src_root(repo, found)
    test_cmd = _test_cmd(repo, found)
    return EnvSpec(
        python=python,
        requirements=_applicable([text for text, _ in found.requirements], python, found.project),
        pip_args=tuple(found.pip_args),
        env=({"PYTHONPATH": f"{WORKDIR}/{root}"} if root else {}) | found.env,
        test_cmd=test_cmd,
        detected_from=(*found.sources, *why),
    )


def _read(repo: Path, python: str | None) -> _Findings:
    """What ``repo``'s files declare, a requirements file named for a Python picked for ``python``."""
    found = _Findings(for_python=python)
    for read in (_read_pyproject, _read_setup_cfg, _read_setup_py, _read_requirements_files, _read_tox):
        read(repo, found)
    if (repo / "pytest.ini").is_file():
        found.runs_pytest("pytest.ini")
    _read_makefile(repo, found)
    _drop_dev_tools(repo, found)
    return found


# --- the repository's files ----------------------------------------------------------------------------


def _read_pyproject(repo: Path, found: _Findings) -> None:
    path = repo / "pyproject.toml"
    if not path.is_file():
        return
    where = path.name
    try:
        data = tomllib.loads(path.read_text(errors="replace"))
    except tomllib.TOMLDecodeError:
        found.note(where, "not valid TOML: ignored")
        return
    project, tool = data.get("project", {}), data.get("tool", {})
    found.name(project.get("name"))
    found.requires_python(project.get("requires-python"), where)
    found.require(project.get("dependencies", []), where, runtime=True)
    extras, groups = project.get("optional-dependencies", {}), data.get("dependency-groups", {})
    names = _test_groups(extras, groups)
    found.require(_groups(extras, names, _self_extras(found.project)), where)
    found.require(_groups(groups, names, _included_group), where)
    if "ini_options" in tool.get("pytest", {}):
        found.runs_pytest(where)
    found.root(_pyproject_root(tool), where)
    found.version_file(repo, version_file(tool), where)
    if "dependencies" in tool.get("poetry", {}) and "dependencies" not in project:
        found.note(where, "poetry dependencies not read")


def _pyproject_root(tool: Mapping[str, Any]) -> str | None:
    """The package directory setuptools, hatch or poetry is configured with (flit finds ``src/`` itself)."""
    setuptools = tool.get("setuptools", {})
    packages = setuptools.get("packages")
    where = packages.get("find", {}).get("where", []) if isinstance(packages, dict) else []
    hatch = tool.get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {}).get("packages", [])
    poetry = [p.get("from") for p in tool.get("poetry", {}).get("packages", []) if isinstance(p, dict)]
    candidates = [setuptools.get("package-dir", {}).get(""), *where, *(p.rpartition("/")[0] for p in hatch), *poetry]
    return next((c for c in candidates if isinstance(c, str) and c.strip("./ ")), None)


def _read_setup_cfg(repo: Path, found: _Findings) -> None:
    cfg = _ini(repo / "setup.cfg", found)
    if cfg is None:
        return
    where = "setup.cfg"
    found.name(cfg.get("metadata", "name", fallback=None))
    options = cfg["options"] if cfg.has_section("options") else {}
    found.requires_python(options.get("python_requires"), where)
    found.require(_lines(options.get("install_requires", "")), where, runtime=True)
    if cfg.has_section("options.extras_require"):
        extras = {name: _lines(value) for name, value in cfg["options.extras_require"].items()}
        found.require(_groups(extras, _test_groups(extras), _self_extras(found.project)), where)
    pairs = (line.partition("=") for line in _lines(options.get("package_dir", "")))
    package_dir = {key.strip(): value.strip() for key, _, value in pairs}
    found.root(package_dir.get("") or cfg.get("options.packages.find", "where", fallback=None), where)
    if cfg.has_section("tool:pytest"):
        found.runs_pytest(where)


def _read_setup_py(repo: Path, found: _Findings) -> None:
    """Literal ``setup()`` arguments only: anything computed is ignored, and said so in the provenance."""
    path = repo / "setup.py"
    if not path.is_file():
        return
    where = path.name
    try:
        tree = pyast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        found.note(where, "not Python 3: ignored")
        return
    call = next((node for node in ast.walk(tree) if isinstance(node, ast.Call) and _callee(node) == "setup"), None)
    if call is None:
        return
    args: dict[str, Any] = {}
    wanted = (
        "name",
        "python_requires",
        "install_requires",
        "tests_require",
        "extras_require",
        "package_dir",
        "use_scm_version",
    )
    for keyword in call.keywords:
        if keyword.arg is None:
            found.note(where, "**arguments not read")
        elif keyword.arg in wanted:
            try:
                args[keyword.arg] = ast.literal_eval(keyword.value)
            except ValueError:
                found.note(where, f"{keyword.arg} not literal: ignored")
    found.name(args.get("name"))
    found.requires_python(args.get("python_requires"), where)
    found.require(_as_list(args.get("install_requires")), where, runtime=True)
    found.require(_as_list(args.get("tests_require")), where)
    extras = args.get("extras_require")
    if isinstance(extras, dict):
        extras = {k: _as_list(v) for k, v in extras.items()}
        found.require(_groups(extras, _test_groups(extras), _self_extras(found.project)), where)
    package_dir = args.get("package_dir")
    found.root(package_dir.get("") if isinstance(package_dir, dict) else None, where)
    scm = args.get("use_scm_version")
    if isinstance(scm, dict):
        found.version_file(repo, scm.get("write_to") or scm.get("version_file"), where)


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _read_requirements_files(repo: Path, found: _Findings) -> None:
    """``requirements.txt`` (runtime), then one test requirements file, top level or in ``requirements/``.

    Files there are often pip-compiled pins, each for one purpose or Python (jinja's ``tests.txt``,
    ``tests37.txt``, ``dev.txt``): together they pin one distribution to several versions."""
    runtime = repo / "requirements.txt"
    if runtime.is_file():
        _read_requirements(repo, runtime, found)
    top = sorted(p for p in repo.glob("*requirements*.txt") if p != runtime and _TESTISH.search(p.name))
    roles = {path: _role(path) for path in top + sorted(repo.glob("requirements/*.txt")) if _TESTISH.search(path.stem)}
    for path in sorted(p for d in TEST_GROUPS for p in repo.glob(f"{d}/*requirements*.txt")):
        roles[path] = _role(path) or ("tests", None)  # tests/requirements.txt: the test suite's own (tomli)
    chosen = _test_requirements_file(roles, found.for_python)
    for path, role in roles.items():
        if path == chosen:
            _read_requirements(repo, path, found)
        elif role is not None and role[1] not in (None, found.for_python):
            found.note(_relative(repo, path), f"for Python {role[1]}: not read")
        else:
            found.note(_relative(repo, path), f"not read: {_relative(repo, chosen)} is" if chosen else "not read")


def _role(path: Path) -> tuple[str, str | None] | None:
    """("tests" | "dev", the Python it is for or None) from a requirements file's name; None for another name."""
    match = _ROLE.match(_REQUIREMENTS_WORD.sub("", path.stem.lower()))
    if match is None:
        return None
    role = "dev" if match["role"] == "dev" else "tests"
    return role, f"{match['major']}.{match['minor']}" if match["major"] else None


def _test_requirements_file(roles: Mapping[Path, tuple[str, str | None] | None], python: str | None) -> Path | None:
    """The tests file named for ``python``, else the plain tests file; the dev one (a superset with
    linters, docs and release tools) only where there is neither."""
    for wanted in ("tests", "dev"):
        files = [(path, role[1]) for path, role in roles.items() if role is not None and role[0] == wanted]
        for_python = [path for path, version in files if version is not None and version == python]
        plain = [path for path, version in files if version is None]
        if for_python or plain:
            return (for_python + plain)[0]
    return None


def _relative(repo: Path, path: Path) -> str:
    return path.relative_to(repo).as_posix()


def _read_requirements(repo: Path, path: Path, found: _Findings) -> None:
    path = path.resolve()
    if path in found.read_files:
        return
    found.read_files.add(path)
    if not path.is_relative_to(repo.resolve()) or not path.is_file():
        found.note(path.name, "outside the repository or missing: ignored")
        return
    where = path.relative_to(repo.resolve()).as_posix()
    _take_lines(repo, path.parent, _lines(path.read_text(errors="replace")), where, found)


def _take_lines(repo: Path, base: Path, lines: list[str], where: str, found: _Findings) -> None:
    """Requirement lines as pip reads them: includes followed, index options kept, the repository itself left out."""
    for line in lines:
        match = _OPTION.match(line)
        option, value = (match.group(1), match.group(2).strip()) if match else ("", line)
        if option in ("-r", "--requirement"):
            _read_requirements(repo, base / value, found)
        elif option in ("-c", "--constraint"):
            # Constraints bound what something else requires; the build's lock records what was resolved.
            found.note(where, f"constraints {value} ignored")
        elif option in _PIP_OPTIONS:
            found.pip(option, value, where)
        elif option and option not in ("-e", "--editable"):
            found.note(where, f"option {option} ignored")
        else:
            _take_requirement(re.split(r"\s--?[a-z]", value, maxsplit=1)[0].strip(), where, found)  # no --hash


def _take_requirement(text: str, where: str, found: _Findings) -> None:
    if _LOCAL.match(text):
        return
    if _URL.match(text) or _requirement(text) is not None:
        found.require([text], where)
    else:
        found.note(where, f"{text!r} is not a requirement: ignored")


def _read_tox(repo: Path, found: _Findings) -> None:
    cfg = _ini(repo / "tox.ini", found)
    if cfg is None:
        return
    where = "tox.ini"
    if cfg.has_section("pytest"):
        found.runs_pytest(where)
    if not cfg.has_section("testenv"):
        return
    testenv = cfg["testenv"]
    # Commands run in the repository root, so {toxinidir} is the current directory.
    deps = [_in_root(line) for line in _lines(testenv.get("deps", "")) if not _FACTOR.match(line)]
    _take_lines(repo, repo, [line for line in deps if not _UNRESOLVED.search(line)], where, found)
    for line in _lines(testenv.get("commands", "")):
        if not _FACTOR.match(line):
            found.runs(_runner_command(_argv(_in_root(line).lstrip("-! ")), repo), where)


def _read_makefile(repo: Path, found: _Findings) -> None:
    path = repo / "Makefile"
    if not path.is_file():
        return
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("\t"):
            found.runs(_runner_command(_argv(line.strip().lstrip("@-+")), repo), path.name)


def _ini(path: Path, found: _Findings) -> configparser.ConfigParser | None:
    if not path.is_file():
        return None
    cfg = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        cfg.read_string(path.read_text(errors="replace"), source=path.name)
    except configparser.Error:
        found.note(path.name, "not parsable: ignored")
        return None
    return cfg


def _lines(text: str) -> list[str]:
    """Logical lines of a multi-line value or requirements file: continuations joined, comments and blanks gone."""
    joined = text.replace("\\\n", "")
    return [line for line in (_COMMENT.sub("", raw).strip() for raw in joined.splitlines()) if line]


def _as_list(value: object) -> list[str]:
    """setuptools takes a requirement list or one multi-line string."""
    if isinstance(value, str):
        return _lines(value)
    return [str(v) for v in value] if isinstance(value, list | tuple) else []


def _in_root(text: str) -> str:
    return text.replace("{toxinidir}/", "").replace("{toxinidir}", ".")


def _argv(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError:
        return []


# --- extras and dependency groups ----------------------------------------------------------------------


def _test_groups(*tables: Mapping[str, Any]) -> tuple[str, ...]:
    """The test extras and dependency groups ``tables`` have, or ``dev`` where none of them has one."""
    present = tuple(name for name in TEST_GROUPS if any(name in table for table in tables))
    return present or (DEV_GROUP,)


def _groups(
    groups: Mapping[str, list[Any]], names: Iterable[str], includes: Callable[[Any], list[str] | None]
) -> list[str]:
    """Requirements of the groups ``names``, in order, following the references ``includes`` finds in an entry."""
    out: list[str] = []
    todo, done = list(names), set()
    while todo:
        name = todo.pop(0)
        if name in done or name not in groups:
            continue
        done.add(name)
        for item in groups[name]:
            nested = includes(item)
            if nested is None:
                out.append(item)
            else:
                todo += nested
    return out


def _self_extras(project: str | None) -> Callable[[Any], list[str] | None]:
    """An extra that names the project itself (``pkg[test]`` in ``pkg``'s ``dev``) includes those extras."""

    def includes(item: Any) -> list[str] | None:
        req = _requirement(item) if isinstance(item, str) else None
        return sorted(req.extras) if req and project and canonicalize_name(req.name) == project else None

    return includes


def _included_group(item: Any) -> list[str] | None:
    """PEP 735: a ``{include-group = "name"}`` entry."""
    return [item.get("include-group", "")] if isinstance(item, dict) else None


def _requirement(text: str) -> Requirement | None:
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def _drop_dev_tools(repo: Path, found: _Findings) -> None:
    """Developer tools among the requirements, unless the project depends on them or its tests import them."""
    tools = [(text, where, name) for text, where in found.requirements if (name := _dev_tool(text, found.runtime))]
    if not tools:
        return
    imported = _imported_by_tests(repo)
    dropped = [(text, where) for text, where, name in tools if name.replace("-", "_") not in imported]
    found.requirements = [item for item in found.requirements if item not in dropped]
    for where in dict.fromkeys(where for _, where in dropped):
        texts = ", ".join(text for text, at in dropped if at == where)
        found.note(where, f"developer tools not installed: {texts}")


def _dev_tool(text: str, runtime: set[str]) -> str | None:
    """The distribution ``text`` names when it is a developer tool the project itself does not depend on."""
    req = _requirement(text)
    name = canonicalize_name(req.name) if req is not None else None
    if name and (name in _DEV_TOOLS or name.startswith(_DEV_TOOL_FAMILIES)) and name not in runtime:
        return name
    return None


def _imported_by_tests(repo: Path) -> set[str]:
    """The top-level modules the test files import."""
    return {name for path in _test_files(repo) for name in _IMPORT.findall(path.read_text(errors="replace"))}


# --- deciding ---------------------------------------------------------------------------------------


def _choose_python(found: _Findings) -> tuple[str, tuple[str, ...]]:
    """3.11 when ``requires-python`` and the pinned test tools allow it, else the newest image Python they
    allow; and, as provenance, the pins that ruled out a Python ``requires-python`` allows."""
    candidates = _allowed_pythons(found.python)
    reasons: dict[tuple[str, str], str] = {}  # (file, requirement): why it ruled out the first Python it did
    for version in candidates:
        blockers = _tool_blockers(found.requirements, version)
        if not blockers:
            return version, tuple(
                f"{where} ({text}: {why}: Python {version})" for (where, text), why in reasons.items()
            )
        for where, text, why in blockers:
            reasons.setdefault((where, text), why)
    pins = "; ".join(f"{text} in {where}: {why}" for (where, text), why in reasons.items())
    raise EnvError(
        f"the pinned test tools run on none of the Pythons requires-python allows ({', '.join(candidates)}): "
        f"{pins}; set `python:` in {OVERRIDE_FILE} or params.yaml env.repos, or `requirements:` with a newer pin"
    )


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


def _tool_blockers(requirements: list[tuple[str, str]], python: str) -> list[tuple[str, str, str]]:
    """(file, requirement, why) for each requirement that allows no release of its tool that runs under ``python``."""
    marker_env = _marker_env(python)
    oldest = {tool: (since, first) for tool, since, first in _OLDEST_RUNNING if Version(python) >= Version(since)}
    blockers = []
    for text, where in requirements:
        req = _requirement(text)
        if req is None or (req.marker is not None and not req.marker.evaluate(marker_env)):
            continue
        since, first = oldest.get(canonicalize_name(req.name), ("", ""))
        if first and not _allows_from(req.specifier, Version(first)):
            blockers.append((where, text, f"no {req.name} it allows runs on Python {since}+, {first} is the first"))
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
        req = _requirement(text)
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


def _test_cmd(repo: Path, found: _Findings) -> tuple[str, ...]:
    """The runner command, with the repository's own pytest ``addopts`` when it runs pytest: the recorder runs
    with ``-o addopts=`` (so that every option passes through ``testrun.command``'s rules), and a suite's
    ``addopts`` is how its authors run it (click's ``-m 'not stress'`` leaves out 31,000 stress cases)."""
    cmd = _runner_cmd(repo, found)
    addopts = _pytest_addopts(repo, found) if runner_of(cmd) == "pytest" else []
    return (*cmd, *addopts)


def _pytest_addopts(repo: Path, found: _Findings) -> list[str]:
    """``addopts`` of the file pytest takes its configuration from: the first of these that has a section."""
    for name, section in PYTEST_CONFIGS:
        path = repo / name
        if name == "pyproject.toml":
            try:
                options = tomllib.loads(path.read_text(errors="replace")).get("tool", {}).get("pytest", {})
            except (OSError, tomllib.TOMLDecodeError):
                continue
            table = options.get("ini_options", options)  # [tool.pytest] itself: pytest 9's native table
            if not table:
                continue
            value = table.get("addopts", "")
        else:
            cfg = _ini(path, found)
            if cfg is None or not cfg.has_section(section):
                continue
            value = cfg.get(section, "addopts", fallback="")
        args = [str(a) for a in value] if isinstance(value, list) else _argv(str(value))
        if args:
            found.note(name, f"pytest addopts: {shlex.join(args)}")
        return args
    return []


def _runner_cmd(repo: Path, found: _Findings) -> tuple[str, ...]:
    """A command the repository spells out, else pytest when anything points at it, else what the tests use."""
    if found.test_cmd:
        return found.test_cmd
    if found.pytest_config or any(_is_pytest(text) for text, _ in found.requirements):
        return PYTEST_CMD
    unittest_files = []
    for path, style in _test_styles(repo):
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
    req = _requirement(text)
    return req is not None and canonicalize_name(req.name).startswith("pytest")


def _test_styles(repo: Path) -> Iterator[tuple[str, str | None]]:
    """(path, "pytest" | "unittest" | None) per test file: pytest for a conftest, pytest imports, plain
    test functions or classes; unittest for ``TestCase``."""
    for path in _test_files(repo):
        rel = path.relative_to(repo).as_posix()
        text = path.read_text(errors="replace")
        if path.name == "conftest.py" or _PYTEST_STYLE.search(text):
            yield rel, "pytest"
        else:
            yield rel, "unittest" if "TestCase" in text else None


def _test_files(repo: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        for name in sorted(files):
            if name == "conftest.py" or _TEST_FILE.match(name):
                yield Path(root) / name


def _runner_command(argv: list[str], repo: Path) -> tuple[str, ...] | None:
    """``argv`` as ``python3 -m pytest|unittest OPTIONS`` when it runs one of them (directly, through
    ``python -m`` or ``coverage run -m``), without substitutions we cannot expand; None otherwise."""
    argv = list(dropwhile(_ASSIGNMENT.match, argv))  # VAR=value prefixes
    if argv[:1] in (["pytest"], ["py.test"]):
        runner, args = "pytest", argv[1:]
    elif argv and (_PYTHON.match(argv[0]) or argv[0] == "coverage"):
        at = next((i for i in range(len(argv) - 1) if argv[i] == "-m" and argv[i + 1] in ("pytest", "unittest")), None)
        if at is None:
            return None
        runner, args = argv[at + 1], argv[at + 2 :]
    else:
        return None
    args = [arg for arg in args if not _UNRESOLVED.search(arg)]
    if runner == "pytest":
        return (*PYTEST_CMD, *_without_test_dirs(args, repo))
    return (*UNITTEST_CMD, *args)


def _without_test_dirs(args: list[str], repo: Path) -> list[str]:
    """pytest's options without paths into the test dir: which tests run is the grader's choice."""
    kept = []
    for i, arg in enumerate(args):
        selects = not arg.startswith("-") and (i == 0 or args[i - 1] not in _PYTEST_VALUED)
        if not (selects and arg.startswith("test") and (repo / arg).exists()):
            kept.append(arg)
    return kept


def _src_root(repo: Path, found: _Findings) -> str | None:
    """``src`` for a ``src/`` holding a package or module that the repository root does not also hold."""
    src = repo / "src"
    if not src.is_dir() or (src / "__init__.py").exists():  # src itself a package: imported from the root
        return None
    code = {p.stem for p in src.iterdir() if p.suffix == ".py" or (p.is_dir() and any(p.glob("*.py")))}
    if any(not (repo / name).exists() and not (repo / f"{name}.py").exists() for name in code):
        found.source("src/")
        return "src"
    return None


# --- overrides -------------------------------------------------------------------------------------


def resolve_env(repo: Path, repo_name: str, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> EnvSpec:
    """The detected spec, then ``repo``'s ``trialforge-env.yaml``, then ``overrides[repo_name]``: later wins per key.

    A ``python`` set by an override is also the one markers are evaluated for, and ``requires-python``
    is not checked: the way to run a repository under a Python its metadata does not allow.
    """
    sources = ((OVERRIDE_FILE, _override_file(repo, repo_name)), (PARAMS_SOURCE, (overrides or {}).get(repo_name)))
    layers = [_layer(values, source, repo_name) for source, values in sources if values]
    python = next((values["python"] for _, values in reversed(layers) if "python" in values), None)
    spec = _detect(repo, python)
    for source, values in layers:
        spec = spec.model_copy(update={**values, "detected_from": (*spec.detected_from, source)})
    return spec


def _override_file(repo: Path, repo_name: str) -> object:
    path = repo / OVERRIDE_FILE
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text(errors="replace"))
    except yaml.YAMLError as exc:
        raise EnvError(f"{OVERRIDE_FILE} of {repo_name} is not valid YAML: {exc}") from None


def _layer(values: object, source: str, repo_name: str) -> tuple[str, dict[str, Any]]:
    """(source, the values it sets, validated as EnvSpec fields)."""
    where = f"{source} for {repo_name}"
    if not isinstance(values, Mapping):
        raise EnvError(f"{where}: expected a mapping with keys from {', '.join(OVERRIDABLE)}, got {values!r}")
    unknown = sorted(str(key) for key in values if key not in OVERRIDABLE)
    if unknown:
        raise EnvError(f"{where}: unknown key {', '.join(map(repr, unknown))} (known: {', '.join(OVERRIDABLE)})")
    if isinstance(values.get("python"), float):
        raise EnvError(f'{where}: python {values["python"]} is a number: quote it ("3.13"); YAML reads 3.10 as 3.1')
    try:
        checked = EnvSpec.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise EnvError(f"{where}: {problems}") from None
    return source, {key: getattr(checked, key) for key in values}


# --- a repository at a commit --------------------------------------------------------------------------


def spec_at_commit(
    mirror: Path, commit: str, repo_name: str, overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> EnvSpec:
    """The resolved spec of ``mirror``'s tree at ``commit`` (for SWE-bench: ``environment_setup_commit``)."""
    with scratch_dir("envdetect") as tmp:
        tree = Path(tmp) / "tree"
        materialize(mirror, commit, tree)
        return resolve_env(tree, repo_name, overrides)


@dataclass
class EnvCache:
    """Specs by (repository, commit), failures included: the instances of one SWE-bench version share
    one environment commit, so it is materialized and read once."""

    overrides: Mapping[str, Mapping[str, Any]] | None = None
    specs: dict[tuple[str, str], EnvSpec | EnvError] = field(default_factory=dict)

    def get(self, mirror: Path, commit: str, repo_name: str) -> EnvSpec:
        key = (repo_name, commit)
        if key not in self.specs:
            try:
                self.specs[key] = spec_at_commit(mirror, commit, repo_name, self.overrides)
            except EnvError as exc:
                self.specs[key] = exc
        found = self.specs[key]
        if isinstance(found, EnvError):
            raise found
        return found
