"""A task's test command and environment, as the recorder may honour them.

Each option of ``EnvSpec.test_cmd`` is **honoured** (it changes which tests run or how, never how they are
reported), **dropped with its reason** (``PYTEST_REFUSED``, ``UNITTEST_REFUSED``), or **the host's** (runs that name
their tests drop the task's selection options). The recorder's own options come after the task's, so they win.
``EnvSpec.env`` goes over the sandbox's environment except ``REFUSED_ENV``. Why each: docs/verification.md,
"Test commands".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

_STOPS = "the run stops where the host says (--maxfail when grading): an earlier stop leaves outcomes unknown"
_CACHE = "selects by an earlier run's cache: every run is fresh and the cache plugin is off"
_NO_RUN = "prints or collects instead of running the tests: no outcomes"
_CONFIG = "moves the configuration or root to another file: node ids and the pristine-config layer are the host's"
_DEBUG = "a debugger or trace function in the graded process"
_WORKERS = "runs tests in worker processes the recorder does not watch"
_RERUNS = "reports a test several times"

# pytest options dropped (with their value, when they take one), and why.
PYTEST_REFUSED: dict[str, str] = {
    "-x": _STOPS, "--exitfirst": _STOPS, "--maxfail": _STOPS,
    "--sw": _CACHE, "--stepwise": _CACHE, "--sw-skip": _CACHE, "--stepwise-skip": _CACHE,
    "--lf": _CACHE, "--last-failed": _CACHE, "--ff": _CACHE, "--failed-first": _CACHE,
    "--nf": _CACHE, "--new-first": _CACHE, "--lfnf": _CACHE, "--last-failed-no-failures": _CACHE,
    "--cache-clear": _CACHE, "--cache-show": _NO_RUN,
    "--co": _NO_RUN, "--collect-only": _NO_RUN, "--collectonly": _NO_RUN, "--setup-only": _NO_RUN,
    "--setup-plan": _NO_RUN, "--fixtures": _NO_RUN, "--funcargs": _NO_RUN, "--fixtures-per-test": _NO_RUN,
    "--markers": _NO_RUN, "-h": _NO_RUN, "--help": _NO_RUN, "-V": _NO_RUN, "--version": _NO_RUN,
    "-c": _CONFIG, "--config-file": _CONFIG, "--inifile": _CONFIG, "--rootdir": _CONFIG, "--confcutdir": _CONFIG,
    "--basetemp": "pytest empties that directory before the run",
    "--pdb": _DEBUG, "--pdbcls": _DEBUG, "--trace": _DEBUG,
    "-n": _WORKERS, "--numprocesses": _WORKERS, "--maxprocesses": _WORKERS, "--dist": _WORKERS, "-d": _WORKERS,
    "--tx": _WORKERS, "--looponfail": _WORKERS, "-f": _WORKERS, "--forked": _WORKERS, "--boxed": _WORKERS,
    "--reruns": _RERUNS, "--reruns-delay": _RERUNS, "--only-rerun": _RERUNS,
    # coverage measures through a trace function: the audit hook would rightly call that tampering
    "--cov": _DEBUG, "--cov-report": _DEBUG, "--cov-config": _DEBUG, "--cov-fail-under": _DEBUG,
    "--cov-append": _DEBUG, "--cov-branch": _DEBUG, "--cov-context": _DEBUG,
}  # fmt: skip
# `-p no:NAME` is honoured for these only: disabling any other plugin (python, unittest, skipping, runner...)
# changes what a test is or how its outcome is reported.
PYTEST_NO_PLUGINS = frozenset(
    {"cacheprovider", "randomly", "random_order", "warnings", "faulthandler", "doctest", "cov", "pytest_cov",
     "xdist", "legacypath", "pastebin", "junitxml", "sugar", "benchmark", "timeout", "rerunfailures"}
)  # fmt: skip
_NO_PLUGIN = "disables a plugin that decides what a test is or how its outcome is reported"
# pytest options that take a value as the next argument (so that value is not read as a test path).
PYTEST_VALUED = frozenset(
    {"-k", "-m", "-p", "-c", "-o", "-W", "-r", "--tb", "--maxfail", "--deselect", "--ignore", "--ignore-glob",
     "--rootdir", "--confcutdir", "--basetemp", "--import-mode", "--capture", "--durations", "--durations-min",
     "--junitxml", "--junit-xml", "--junit-prefix", "--log-level", "--log-format", "--log-date-format",
     "--log-cli-level", "--log-cli-format", "--log-cli-date-format", "--log-file", "--log-file-level",
     "--log-file-format", "--log-file-date-format", "--log-auto-indent", "--override-ini", "--config-file",
     "--inifile", "--color", "--code-highlight", "--pdbcls", "--doctest-glob", "--doctest-report", "--timeout",
     "--timeout-method", "-n", "--numprocesses", "--maxprocesses", "--dist", "--tx", "--reruns", "--reruns-delay",
     "--only-rerun", "--verbosity", "--show-capture", "--assert", "--cov", "--cov-report",
     "--cov-config", "--cov-fail-under", "--cov-context", "--rsyncdir", "--max-worker-restart",
     "--random-order-seed", "--pythonwarnings"}
)  # fmt: skip
# Selection: honoured in whole-suite runs, the host's in runs that name their tests (module docstring).
PYTEST_SELECTION = frozenset({"-k", "-m", "--deselect", "--ignore", "--ignore-glob"})
_COMBINED_FLAGS = frozenset("vqslx")  # pytest's short flags that can be written together (-xvs)

UNITTEST_REFUSED: dict[str, str] = {"-f": _STOPS, "--failfast": _STOPS}
# Options of `python -m unittest` that change nothing under the recorder (output, signal handling, buffering).
UNITTEST_IGNORED = frozenset({"-v", "--verbose", "-q", "--quiet", "--locals", "-b", "--buffer", "-c", "--catch"})

REFUSED_ENV: dict[str, str] = {
    "PATH": "picks the python3 that runs the recorder",
    "HOME": "the sandbox's scratch home",
    "LD_*": "loads native code into the interpreter before it starts",
    "PYTHON*": "interpreter settings that move the standard library or run code at start-up",
}
# PYTHON* variables a task may set: none of them changes where the interpreter or the standard library comes from.
PYTHON_ENV_ALLOWED = frozenset(
    {"PYTHONPATH", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONDEVMODE",
     "PYTHONFAULTHANDLER", "PYTHONASYNCIODEBUG", "PYTHONTRACEMALLOC", "PYTHONINTMAXSTRDIGITS"}
)  # fmt: skip


NAMED_TESTS = ": the run names its tests"  # why a graded run drops the task's selection


@dataclass(frozen=True)
class Dropped:
    option: str  # as written in the command (with its value)
    reason: str


@dataclass(frozen=True)
class PytestArgs:
    args: list[str]  # the task's options the run keeps, in their order
    dropped: list[Dropped] = field(default_factory=list)


def pytest_args(user: Sequence[str], *, named_tests: bool, keep_selection: bool = False) -> PytestArgs:
    """The task's pytest options the recorder honours (module docstring); ``named_tests``: the run names its tests.
    ``keep_selection``: they are whole modules run apart (validation's rerun of a stopped run), where the task's
    -k/-m/--deselect still choose, as in the whole-suite run they stand for.

    An option this module does not know is kept; if it takes a value, the value must be attached (``--opt=v``)
    for a run that names its tests to tell it from a test path (a detached one is kept as its value).
    """
    kept: list[str] = []
    dropped: list[Dropped] = []
    tokens = list(user)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-") or token == "-":
            if named_tests:
                dropped.append(Dropped(token, f"a test path{NAMED_TESTS}"))
            else:
                kept.append(token)
            continue
        name, value, attached = _split(token)
        if name is None:  # combined short flags
            flags = token[1:]
            if "x" in flags:
                dropped.append(Dropped("-x", PYTEST_REFUSED["-x"]))
                flags = flags.replace("x", "")
            if flags:
                kept.append("-" + flags)
            continue
        takes_value = name in PYTEST_VALUED
        if takes_value and not attached and i < len(tokens):
            value = tokens[i]
            i += 1
        elif not takes_value and not attached and name.startswith("--") and _is_value(tokens, i, named_tests):
            value = tokens[i]  # an option this module does not know, with a detached value (see docstring)
            i += 1
            attached = False
        written = [token] if attached or value is None else [token, value]
        reason = _refused(name, value)
        if reason is None and named_tests and not keep_selection and name in PYTEST_SELECTION:
            reason = f"selects tests{NAMED_TESTS}"
        if reason is not None:
            dropped.append(Dropped(" ".join(written), reason))
        else:
            kept += written
    return PytestArgs(kept, dropped)


def _split(token: str) -> tuple[str | None, str | None, bool]:
    """(option name, attached value, whether attached) of ``token``; (None, None, False) for combined short flags."""
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        return name, (value if eq else None), bool(eq)
    if len(token) == 2:
        return token, None, False
    short = token[:2]
    if short in PYTEST_VALUED:
        return short, token[2:].removeprefix("="), True
    if set(token[1:]) <= _COMBINED_FLAGS:
        return None, None, False
    return token, None, False


def _is_value(tokens: list[str], i: int, named_tests: bool) -> bool:
    """Whether the token after an unknown long option is its value (only asked where it matters: named runs)."""
    return named_tests and i < len(tokens) and not tokens[i].startswith("-")


def _refused(name: str, value: str | None) -> str | None:
    if name == "-p" and value is not None and value.startswith("no:"):
        return None if value[3:] in PYTEST_NO_PLUGINS else _NO_PLUGIN
    return PYTEST_REFUSED.get(name)


@dataclass(frozen=True)
class UnittestPlan:
    """What `python -m unittest [args]` would load, for the recorder's own loader (recorder_program.py)."""

    start: str = "."  # discovery: start directory, file pattern, top-level directory (None: the start)
    pattern: str = "test*.py"
    top: str | None = None
    names: list[str] = field(default_factory=list)  # modules, classes or methods (or .py paths); none: discover
    patterns: list[str] = field(default_factory=list)  # -k: unittest's name patterns
    dropped: list[Dropped] = field(default_factory=list)

    def for_recorder(self) -> dict[str, Any]:
        return {"start": self.start, "pattern": self.pattern, "top": self.top, "names": self.names,
                "patterns": self.patterns}  # fmt: skip


def unittest_plan(user: Sequence[str], *, named_tests: bool, keep_selection: bool = False) -> UnittestPlan:
    """Read `python -m unittest` options (``discover`` and its -s/-p/-t, names, -k) into a plan.

    A run that names its tests keeps only the top-level directory (module names are relative to it), and its -k
    patterns only with ``keep_selection`` (``pytest_args``).
    """
    tokens = list(user)
    discover = tokens[:1] == ["discover"]
    tokens = tokens[1:] if discover else tokens
    slots: dict[str, str] = {}
    positional: list[str] = []
    patterns: list[str] = []
    dropped: list[Dropped] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-") or token == "-":
            positional.append(token)
            continue
        name, value = _unittest_option(token)
        if name in _UNITTEST_VALUED:
            if value is None:
                value = tokens[i] if i < len(tokens) else ""
                i += 1
            if name == "-k":
                patterns.append(value)
            elif name in _DISCOVERY and discover:
                slots[_DISCOVERY[name]] = value
            elif name in _DISCOVERY:
                dropped.append(Dropped(f"{name} {value}", "a discovery option without `discover`"))
        elif name in UNITTEST_REFUSED:
            dropped.append(Dropped(token, UNITTEST_REFUSED[name]))
        elif name not in UNITTEST_IGNORED:
            dropped.append(Dropped(token, "not an option of python -m unittest"))
    names: list[str] = []
    if discover:
        for slot, value in zip(("start", "pattern", "top"), positional, strict=False):
            slots.setdefault(slot, value)
    else:
        names = positional
    if named_tests:
        dropped += [Dropped(n, f"a test name{NAMED_TESTS}") for n in names]
        if not keep_selection:
            dropped += [Dropped(f"-k {p}", f"selects tests{NAMED_TESTS}") for p in patterns]
        kept = patterns if keep_selection else []
        return UnittestPlan(top=slots.get("top") or slots.get("start"), patterns=kept, dropped=dropped)
    return UnittestPlan(
        start=slots.get("start", "."), pattern=slots.get("pattern", "test*.py"), top=slots.get("top"),
        names=names, patterns=patterns, dropped=dropped,
    )  # fmt: skip


_DISCOVERY = {"-s": "start", "--start-directory": "start", "-p": "pattern", "--pattern": "pattern",
              "-t": "top", "--top-level-directory": "top"}  # fmt: skip
_UNITTEST_VALUED = frozenset({*_DISCOVERY, "-k", "--durations"})


def _unittest_option(token: str) -> tuple[str, str | None]:
    """(name, attached value or None): ``--pattern=x``, ``-sdir``, ``-kfoo``."""
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        return name, (value if eq else None)
    if len(token) > 2 and token[:2] in _UNITTEST_VALUED:
        return token[:2], token[2:]
    return token, None


def run_env(env: Mapping[str, str]) -> tuple[dict[str, str], list[Dropped]]:
    """The task's environment variables the run may set (over the sandbox's), and those refused (module docstring)."""
    kept: dict[str, str] = {}
    dropped: list[Dropped] = []
    for name, value in env.items():
        if name in ("PATH", "HOME"):
            reason: str | None = REFUSED_ENV[name]
        elif name.startswith("LD_"):
            reason = REFUSED_ENV["LD_*"]
        elif name.startswith("PYTHON") and name not in PYTHON_ENV_ALLOWED:
            reason = REFUSED_ENV["PYTHON*"]
        else:
            reason = None
        if reason is None:
            kept[name] = value
        else:
            dropped.append(Dropped(f"{name}={value}", reason))
    return kept, dropped


_logged: set[str] = set()  # every validation and grading run reads the same spec: say it once per process


def log_dropped(what: str, dropped: Sequence[Dropped]) -> None:
    """A warning naming what ``what`` lost and why, the first time this process sees it; an info line when all
    it lost is selection a run that names its tests never takes (by design, every graded run)."""
    said = f"{what}: {[d.option for d in dropped]}"
    if dropped and said not in _logged:
        _logged.add(said)
        expected = all(d.reason.endswith(NAMED_TESTS) for d in dropped)
        log.log(
            logging.INFO if expected else logging.WARNING,
            "%s: ignored %s", what, "; ".join(f"{d.option} ({d.reason})" for d in dropped),
            extra={"dropped": [d.option for d in dropped]},
        )  # fmt: skip
