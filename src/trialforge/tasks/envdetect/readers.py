"""What a repository's own files declare about its environment, read without executing anything.

``pyproject.toml`` and ``setup.cfg`` are parsed, ``setup.py`` is read as a syntax tree (literal arguments
only; what it computes comes from an evaluation in a sandbox, ``tasks.setupeval``, when the caller has one),
requirements files, ``tox.ini`` and ``Makefile`` as text, test files for what they import and which
runner they are written for. Everything found goes into one :class:`Findings`, each fact with the file it
came from; ``decide`` turns it into an ``EnvSpec``.
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

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from trialforge import pyast
from trialforge.envspec import PYTEST_CMD, UNITTEST_CMD
from trialforge.tasks.buildfiles import version_file

TEST_GROUPS = ("test", "tests", "testing")  # extras and dependency groups a test run needs
DEV_GROUP = "dev"  # mostly linters and release tools: read only where no test group exists

# Requirements-file options that reach the image build's pip as written (where packages come from).
_PIP_OPTIONS = frozenset({"-i", "--index-url", "--extra-index-url", "--trusted-host", "-f", "--find-links", "--pre"})
# pytest options whose next token is their value, never a test selection (even when it names a test dir).
_PYTEST_VALUED = frozenset({"--rootdir", "--confcutdir", "--basetemp", "--ignore", "--deselect", "--cov", "-c", "-k"})
_OPTION = re.compile(r"^(--[\w-]+|-\w)\s*=?\s*(.*)$")
_COMMENT = re.compile(r"(^|\s)#.*$")  # pip's rule: a '#' after whitespace (a URL's '#egg=' stays)
_LOCAL = re.compile(r"^(?:\.{1,2}(?:[/\[]|$)|/|file:)")  # the repository or a part of it: it lives at /work
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
# git+https://github.com/casperdcl/nbval(.git)(@ref)(#egg=nbval): group 1 the repository's name, 2 the egg's
_VCS = re.compile(r"^(?:git|hg|svn|bzr)\+\S*?/([A-Za-z0-9._-]+?)(?:\.git)?(?:@[^#\s]*)?(?:#egg=([A-Za-z0-9._-]+)\S*)?$")
_FACTOR = re.compile(r"^[\w.,{}!-]+:\s")  # a tox line for some environments only ("py38: mock")
_UNRESOLVED = re.compile(r"\{[^}]*\}|\$[({]")  # tox substitutions and make variables we cannot expand
_TOX_REF = re.compile(r"\{\[([^\]]+)\]([^}]+)\}")
_POSARGS = re.compile(r"\{posargs(?::([^{}]*))?\}")
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
_TEST_FILE = re.compile(r"^(?:test_.*|.*_test|tests?)\.py$")  # a root tests.py: unittest's test*.py finds it
_SKIP_DIRS = frozenset({"node_modules", "build", "dist", "venv", "site-packages", "__pycache__"})
_PYTEST_STYLE = re.compile(
    r"^\s*(?:import pytest|from pytest\b|from _pytest\b)|^(?:async )?def test|^class Test\w*(?:\((?:object)?\))?:",
    re.MULTILINE,
)


@dataclass
class Findings:
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
    # the extension modules setup() declares, as its evaluation in a sandbox reports them: (name, its sources)
    extensions: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    read_files: set[Path] = field(default_factory=set)  # requirements files, each read once
    build_requires: list[str] = field(default_factory=list)  # pyproject's [build-system] requires (PEP 518)
    cython: tuple[str, str] | None = None  # the first Cython requirement declared anywhere, and its file

    def declares(self, requirements: Iterable[object], where: str) -> None:
        """Keep the first Cython requirement among ``requirements`` (from any group, or the build's): what an
        extension built from its .pyx sources needs, wherever the repository says so."""
        for text in requirements:
            if self.cython is None and isinstance(text, str):
                req = parse_requirement(text)
                if req is not None and canonicalize_name(req.name) == "cython":
                    self.cython = (text, where)

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
        requirements = list(requirements)
        self.declares(requirements, where)
        added = []
        for text in filter(None, requirements):
            req = parse_requirement(text)
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


def read(repo: Path, python: str | None, setup_args: Mapping[str, Any] | None = None) -> Findings:
    """What ``repo``'s files declare, a requirements file named for a Python picked for ``python``;
    ``setup_args``: what ``setup.py`` passed to ``setup()`` when evaluated in a sandbox (``tasks.setupeval``)."""
    found = Findings(for_python=python)
    _read_pyproject(repo, found)
    _read_setup_cfg(repo, found)
    _read_setup_py(repo, found, setup_args)
    for reader in (_read_requirements_files, _read_tox):
        reader(repo, found)
    if (repo / "pytest.ini").is_file():
        found.runs_pytest("pytest.ini")
    _read_makefile(repo, found)
    _drop_dev_tools(repo, found)
    return found


# --- the repository's files ----------------------------------------------------------------------------


def _read_pyproject(repo: Path, found: Findings) -> None:
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
    build_system = data.get("build-system", {})
    found.build_requires = [t for t in build_system.get("requires", ()) if isinstance(t, str) and t.strip()]
    for declared in (found.build_requires, *extras.values(), *groups.values()):
        found.declares(declared, where)
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


def _read_setup_cfg(repo: Path, found: Findings) -> None:
    cfg = read_ini(repo / "setup.cfg", found)
    if cfg is None:
        return
    where = "setup.cfg"
    found.name(cfg.get("metadata", "name", fallback=None))
    options = cfg["options"] if cfg.has_section("options") else {}
    found.requires_python(options.get("python_requires"), where)
    found.require(_lines(options.get("install_requires", "")), where, runtime=True)
    found.declares(_lines(options.get("setup_requires", "")), where)
    if cfg.has_section("options.extras_require"):
        extras = {name: _lines(value) for name, value in cfg["options.extras_require"].items()}
        found.require(_groups(extras, _test_groups(extras), _self_extras(found.project)), where)
    pairs = (line.partition("=") for line in _lines(options.get("package_dir", "")))
    package_dir = {key.strip(): value.strip() for key, _, value in pairs}
    found.root(package_dir.get("") or cfg.get("options.packages.find", "where", fallback=None), where)
    if cfg.has_section("tool:pytest"):
        found.runs_pytest(where)


# The setup() arguments envdetect uses: read as literals, or taken from an evaluation in a sandbox.
SETUP_ARGS = (
    "name",
    "python_requires",
    "install_requires",
    "tests_require",
    "extras_require",
    "package_dir",
    "use_scm_version",
    "setup_requires",  # only where Cython is declared for an extension (``Findings.declares``)
    "ext_modules",  # never literal (Extension objects): its presence is what makes a sandbox evaluate setup.py
)


def setup_literals(repo: Path, found: Findings | None = None) -> tuple[dict[str, Any], list[str]] | None:
    """``setup.py``'s literal ``setup()`` arguments and what it computes instead (argument names, ``**``);
    None without a ``setup.py`` that parses and calls ``setup``."""
    path = repo / "setup.py"
    if not path.is_file():
        return None
    try:
        tree = pyast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        if found is not None:
            found.note(path.name, "not Python 3: ignored")
        return None
    call = next((node for node in ast.walk(tree) if isinstance(node, ast.Call) and _callee(node) == "setup"), None)
    if call is None:
        return None
    args: dict[str, Any] = {}
    computed: list[str] = []
    for keyword in call.keywords:
        if keyword.arg is None:
            computed.append("**")
        elif keyword.arg in SETUP_ARGS:
            try:
                args[keyword.arg] = ast.literal_eval(keyword.value)
            except ValueError:
                computed.append(keyword.arg)
    return args, computed


def _read_setup_py(repo: Path, found: Findings, evaluated: Mapping[str, Any] | None) -> None:
    """The arguments an evaluation in a sandbox passed to ``setup()`` when the caller has them, else the
    literal ones only: anything computed is ignored, and said so in the provenance."""
    where = "setup.py"
    if evaluated is not None:
        found.note(where, "setup() arguments evaluated in a sandbox")
        _take_setup_args(repo, evaluated, found, where)
        return
    literals = setup_literals(repo, found)
    if literals is None:
        return
    args, computed = literals
    for name in computed:
        found.note(where, "**arguments not read" if name == "**" else f"{name} not literal: ignored")
    _take_setup_args(repo, args, found, where)


def _take_setup_args(repo: Path, args: Mapping[str, Any], found: Findings, where: str) -> None:
    found.name(args.get("name"))
    found.requires_python(args.get("python_requires"), where)
    found.require(_as_list(args.get("install_requires")), where, runtime=True)
    found.require(_as_list(args.get("tests_require")), where)
    found.declares(_as_list(args.get("setup_requires")), where)
    extras = args.get("extras_require")
    if isinstance(extras, dict):
        extras = {k: _as_list(v) for k, v in extras.items()}
        found.require(_groups(extras, _test_groups(extras), _self_extras(found.project)), where)
    package_dir = args.get("package_dir")
    found.root(package_dir.get("") if isinstance(package_dir, dict) else None, where)
    scm = args.get("use_scm_version")
    if isinstance(scm, dict):
        found.version_file(repo, scm.get("write_to") or scm.get("version_file"), where)
    for ext in args.get("ext_modules") or ():  # only an evaluation reports them, as {name, sources}
        if isinstance(ext, dict) and isinstance(ext.get("name"), str):
            found.extensions.append((ext["name"], tuple(s for s in ext.get("sources") or () if isinstance(s, str))))


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _read_requirements_files(repo: Path, found: Findings) -> None:
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


def _read_requirements(repo: Path, path: Path, found: Findings) -> None:
    path = path.resolve()
    if path in found.read_files:
        return
    found.read_files.add(path)
    if not path.is_relative_to(repo.resolve()) or not path.is_file():
        found.note(path.name, "outside the repository or missing: ignored")
        return
    where = path.relative_to(repo.resolve()).as_posix()
    _take_lines(repo, path.parent, _lines(path.read_text(errors="replace")), where, found)


def _take_lines(repo: Path, base: Path, lines: list[str], where: str, found: Findings) -> None:
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


def _take_requirement(text: str, where: str, found: Findings) -> None:
    if _LOCAL.match(text):
        return
    vcs = _VCS.match(text)
    if vcs:  # the image has no git (and builds from the package index): the project by its name instead
        name = vcs.group(2) or vcs.group(1)
        found.require([name], where)
        found.note(where, f"{text} installed as {name} from the package index")
        return
    if _URL.match(text) or parse_requirement(text) is not None:
        found.require([text], where)
    else:
        found.note(where, f"{text!r} is not a requirement: ignored")


def _read_tox(repo: Path, found: Findings) -> None:
    cfg, where = read_ini(repo / "tox.ini", found), "tox.ini"
    if cfg is None:  # tox's next place: pyproject.toml's [tool.tox] legacy_tox_ini (tqdm since 2025)
        cfg, where = _legacy_tox_ini(repo), "pyproject.toml (tool.tox)"
    if cfg is None:
        return
    if cfg.has_section("pytest"):
        found.runs_pytest(where)
    if not cfg.has_section("testenv"):
        return
    testenv = cfg["testenv"]
    # Commands run in the repository root, so {toxinidir} is the current directory.
    deps = [_in_root(line) for line in _tox_lines(cfg, testenv.get("deps", "")) if not _FACTOR.match(line)]
    _take_lines(repo, repo, [line for line in deps if not _UNRESOLVED.search(line)], where, found)
    lines = [line for line in _tox_lines(cfg, testenv.get("commands", "")) if not _FACTOR.match(line)]
    words = [shell_words(_posargs(_in_root(line)).lstrip("-! ")) for line in lines]
    commands = [(argv, cmd) for argv in words if (cmd := _runner_command(argv, repo))]
    # A suite run in parts (tqdm: its notebook through nbval, then the rest with -k "not perf") is run as the part
    # that names no test file: the others run only what they name; the whole suite runs with that part's options.
    whole = [cmd for argv, cmd in commands if not _test_paths(argv, repo)]
    named = [" ".join(argv) for argv, _ in commands if _test_paths(argv, repo)]
    if whole and named:
        found.note(where, f"runs its suite in parts: the part that names no test file, not {'; '.join(named)}")
    for cmd in whole or [cmd for _, cmd in commands]:
        found.runs(cmd, where)


def _legacy_tox_ini(repo: Path) -> configparser.ConfigParser | None:
    try:
        tool = tomllib.loads((repo / "pyproject.toml").read_text(errors="replace")).get("tool", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    text = tool.get("tox", {}).get("legacy_tox_ini") if isinstance(tool.get("tox"), dict) else None
    if not isinstance(text, str):
        return None
    cfg = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        cfg.read_string(text)
    except configparser.Error:
        return None
    return cfg


def _tox_lines(cfg: configparser.ConfigParser, text: str, depth: int = 0) -> list[str]:
    """A tox value's lines with each ``{[section]key}`` line replaced by that value's lines, as tox does."""
    lines = []
    for line in _lines(text):
        ref = _TOX_REF.fullmatch(line)
        if ref is None:
            lines.append(line)
        elif depth < 8 and cfg.has_option(ref.group(1), ref.group(2)):  # a cycle stops, not recurses forever
            lines.extend(_tox_lines(cfg, cfg.get(ref.group(1), ref.group(2)), depth + 1))
    return lines


def _read_makefile(repo: Path, found: Findings) -> None:
    path = repo / "Makefile"
    if not path.is_file():
        return
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("\t"):
            found.runs(_runner_command(shell_words(line.strip().lstrip("@-+")), repo), path.name)


def read_ini(path: Path, found: Findings) -> configparser.ConfigParser | None:
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


def _posargs(command: str) -> str:
    """tox's ``{posargs:DEFAULT}`` as tox runs it with no arguments given: its default (which may hold spaces and
    quotes, so it is expanded before the line is split into words), and ``{posargs}`` as nothing."""
    return _POSARGS.sub(lambda m: m.group(1) or "", command)


def shell_words(line: str) -> list[str]:
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
        req = parse_requirement(item) if isinstance(item, str) else None
        return sorted(req.extras) if req and project and canonicalize_name(req.name) == project else None

    return includes


def _included_group(item: Any) -> list[str] | None:
    """PEP 735: a ``{include-group = "name"}`` entry."""
    return [item.get("include-group", "")] if isinstance(item, dict) else None


def parse_requirement(text: str) -> Requirement | None:
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def _drop_dev_tools(repo: Path, found: Findings) -> None:
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
    req = parse_requirement(text)
    name = canonicalize_name(req.name) if req is not None else None
    if name and (name in _DEV_TOOLS or name.startswith(_DEV_TOOL_FAMILIES)) and name not in runtime:
        return name
    return None


def _imported_by_tests(repo: Path) -> set[str]:
    """The top-level modules the test files import."""
    return {name for path in _test_files(repo) for name in _IMPORT.findall(path.read_text(errors="replace"))}


# --- test files ---------------------------------------------------------------------------------------


def test_styles(repo: Path) -> Iterator[tuple[str, str | None]]:
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
    paths = set(_test_paths(args, repo))
    return [arg for i, arg in enumerate(args) if i not in paths]


def _test_paths(args: list[str], repo: Path) -> list[int]:
    """Where ``args`` names a path into the repository's tests (a value of an option is no path)."""
    return [
        i for i, arg in enumerate(args)
        if not arg.startswith("-") and (i == 0 or args[i - 1] not in _PYTEST_VALUED)
        and arg.startswith("test") and (repo / arg).exists()
    ]  # fmt: skip
