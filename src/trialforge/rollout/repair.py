"""The small learnable policy of the embedded demo: its episode, a state machine over tool calls, and its policies.

It sees only what the environment shows (never the gold patch, the test patch or the failing tests' list): it
localises the fault from the tests, proposes single-line repair edits (``repair_edits``) on the implicated lines and
samples them from a softmax over a linear score of shared features; training moves the weights toward the edits
that earned reward. How an episode goes: docs/rollouts.md, "The repair policy".
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter

from trialforge.rollout.env import Action
from trialforge.rollout.policies import Decision, TaskView
from trialforge.rollout.repair_edits import (
    N_FEATURES,
    Candidate,
    Evidence,
    ViewedFunction,
    candidates,
    line_edits,
    viewed_functions,
)
from trialforge.tasks.patches import is_test_path

# Library frames, in pytest's short form ("pkg/mod.py:12: in func") or a plain traceback's.
_FRAME = re.compile(r'^\s*(?:File "(?:/work/)?)?([\w./-]+\.py)"?(?::|, line )(\d+)(?::|,) in (\w+)', re.MULTILINE)
_FAILED = re.compile(r"^(?:FAILED|ERROR) ([\w./-]+\.py::\w+)", re.MULTILINE)
_CALL = re.compile(r"(\.?)\b([A-Za-z_]\w*)\s*\(")
_NAMED = re.compile(r"`(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)`")  # a name the issue quotes: `slugify`, `Ledger.balance`
_STATED_TEST = re.compile(r"^- `?([\w./-]+\.py::[\w.:\[\]-]+)", re.MULTILINE)  # a failing test the issue lists
_DURATION = re.compile(r" in (\d+(?:\.\d+)?)s\b")
_SPECTRUM_TOTALS = re.compile(r"^spectrum: (\d+) failing, (\d+) passing$", re.MULTILINE)
_SPECTRUM_LINE = re.compile(r"^([\w./-]+\.py):(\d+)-(\d+) (\d+) (\d+)$", re.MULTILINE)
# Called bare, these are the language's own, not the repository's.
_BUILTINS = frozenset(
    {"assert", "len", "str", "int", "float", "bool", "list", "dict", "set", "frozenset", "tuple", "print", "range",
     "isinstance", "sorted", "reversed", "repr", "type", "getattr", "setattr", "hasattr", "open", "enumerate", "zip",
     "map", "filter", "sum", "min", "max", "any", "all", "abs", "round", "iter", "next", "super", "object",
     "Exception", "ValueError", "TypeError", "KeyError", "AssertionError", "Decimal", "main", "python3", "pytest"}
)  # fmt: skip
_FILLER = frozenset({"and", "the", "for", "with", "not", "from", "into", "when", "that", "does", "are", "has", "its",
                     "after", "before", "all", "one", "two", "can", "should", "works", "still"})  # fmt: skip
_TEST_HELPERS = frozenset({"raises", "approx", "parametrize", "fixture", "mark", "warns", "skip", "fail"})
MAX_VIEWS = 3  # library files viewed per episode
# Checked edits per episode: test, spectrum, three views, five edits with their checks and a submit fill the
# demo's 16 turns. Fewer, and the untrained policy so rarely succeeds that its groups carry no signal.
ATTEMPTS = 5

# Runs the suite under a line tracer and prints, for each run of library lines some failing test executed,
# how many failing and passing tests executed it (spectrum-based fault localisation, no coverage package needed),
# the most suspicious runs first so that a long listing can be cut.
SPECTRUM_SCRIPT = """
import collections, os, sys
import pytest
root, ran, failed, seen, current = os.getcwd() + os.sep, collections.defaultdict(set), set(), set(), [""]
def trace(frame, event, arg):
    path = frame.f_code.co_filename
    if not path.startswith(root):
        return None
    if event == "line":
        ran[path[len(root):], frame.f_lineno].add(current[0])
    return trace
class Spectrum:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        current[0] = item.nodeid
        seen.add(item.nodeid)
        yield
    def pytest_runtest_logreport(self, report):
        if report.failed:
            failed.add(report.nodeid)
sys.settrace(trace)
pytest.main(["-p", "no:cacheprovider", "-p", "no:terminal"], plugins=[Spectrum()])
sys.settrace(None)
print(f"spectrum: {len(failed)} failing, {len(seen - failed)} passing")
runs = []
for (path, line), tests in sorted(ran.items()):
    parts = path.split(os.sep)
    if not tests & failed or parts[-1].startswith("test_") or {"tests", "test"} & set(parts[:-1]):
        continue
    counts = (len(tests & failed), len(tests - failed))
    if runs and runs[-1][0] == path and runs[-1][2] == line - 1 and runs[-1][3] == counts:
        runs[-1][2] = line
    else:
        runs.append([path, line, line, counts])
for path, first, last, (nf, np) in sorted(runs, key=lambda run: -run[3][0] / sum(run[3]) ** 0.5):
    print(f"{path}:{first}-{last} {nf} {np}")
"""


class RepairEpisode:
    """One episode: test, localise, view, then up to ``attempts`` sampled edits, each checked against the tests.

    Each edit is one decision (a "token" for the loss): sampled from a softmax over
    the candidates not tried yet, with its log-probability and the features it was
    chosen from recorded, so training can recompute it under new weights, and the
    softmax's entropy (a health check watches it for collapse).
    """

    def __init__(self, weights: list[float], view: TaskView, seed: int, attempts: int) -> None:
        self.weights = weights
        self.view = view
        self.rng = random.Random(seed)
        self.attempts = attempts
        self.evidence = Evidence()
        self.pending: list[str] = []  # files still to view
        self.functions: list[ViewedFunction] = []
        self.candidates: list[Candidate] = []
        self.applied: Candidate | None = None
        self.phase = "test"

    def act(self, observation: str) -> Decision:
        handler = getattr(self, f"_{self.phase}")
        return handler(observation)

    def _test(self, _: str) -> Decision:
        self.phase = "locate"
        return _run("python3 -m pytest -q --tb=short -p no:cacheprovider 2>&1 | tail -n 80")

    def _locate(self, test_output: str) -> Decision:
        ev = self.evidence
        ev.failing_tests = list(dict.fromkeys(_FAILED.findall(test_output)))
        ev.test_words = [set(t.rpartition("::")[2].split("_")) - {"test"} for t in ev.failing_tests]
        for path, line, function in _FRAME.findall(test_output):
            path = path.removeprefix("/work/")
            if not is_test_path(path):
                ev.frames.setdefault(path, set()).add(int(line))
                ev.frame_functions.add(function)
        statement = self.view.problem_statement
        ev.output_names = set(_called_names(test_output + "\n" + statement)) | set(_quoted_names(statement))
        ev.suite_s = max((float(s) for s in _DURATION.findall(test_output)), default=0.0)
        if not ev.failing_tests:  # the failing tests are hidden: the issue lists their names
            ev.test_words = [set(t.rpartition("::")[2].split("[")[0].split("_")) - {"test"}
                             for t in dict.fromkeys(_STATED_TEST.findall(statement))]  # fmt: skip
        if ev.failing_tests:
            self.phase = "spectrum"
            return _run(f"python3 -c {_quote(SPECTRUM_SCRIPT)} 2>&1 | head -n 150")
        # nothing fails here: the functions the issue names, those named like the failing tests, and the modules
        # named like their test modules (tests/test_csvio.py tests csvio.py), each match a line of the listing
        words = sorted(ev.output_names | {w for ws in ev.test_words for w in ws if _telling(w)})
        stems = sorted({m for t in _STATED_TEST.findall(statement) if (m := _tested_module(t))})
        if not words and not stems:  # and nothing names a function or a module: nothing to go on
            return self._submit()
        self.phase = "grep"
        found = []
        if words:
            pattern = "|".join(words)
            found.append(f"grep -rnE --include='*.py' '^\\s*(async\\s+)?def \\w*({pattern})\\w*\\s*\\(' . | head -n 60")
        if stems:
            names = " -o ".join(f"-name {_quote(stem + '.py')}" for stem in stems)
            found.append(f"find . \\( {names} \\) -not -path './.*' | sed 's/$/:0:/' | head -n 20")
        return _run("; ".join(found))

    def _spectrum(self, output: str) -> Decision:
        ev = self.evidence
        if totals := _SPECTRUM_TOTALS.search(output):
            ev.totals = (int(totals.group(1)), int(totals.group(2)))
        for path, first, last, failing, passing in _SPECTRUM_LINE.findall(output):
            if not is_test_path(path):
                for line in range(int(first), int(last) + 1):
                    ev.spectrum[path, line] = (int(failing), int(passing))
        best: dict[str, float] = {}
        for path, line in ev.spectrum:
            best[path] = max(best.get(path, 0.0), ev.suspiciousness(path, line))
        return self._view_files(sorted(best, key=lambda p: (-best[p], p)))

    def _grep(self, output: str) -> Decision:
        hits = [p for p in re.findall(r"^\./([\w./-]+\.py):\d+:", output, re.MULTILINE) if not is_test_path(p)]
        counts = Counter(hits)
        return self._view_files(sorted(counts, key=lambda p: (-counts[p], hits.index(p))))  # most matches first

    def _view_files(self, paths: list[str]) -> Decision:
        self.pending = paths[:MAX_VIEWS]
        self.phase = "read"
        return self._view_next() if self.pending else self._submit()

    def _view_next(self) -> Decision:
        return Decision(Action(tool="view", args={"path": self.pending[0]}))

    def _read(self, listing: str) -> Decision:
        self.functions += viewed_functions(self.pending.pop(0), listing)
        if self.pending:
            return self._view_next()
        self.candidates = candidates(self.functions, self.evidence)
        return self._edit()

    def _edit(self) -> Decision:
        """Sample an untried candidate; undo the previous attempt in the same command."""
        if not self.candidates or self.attempts == 0:
            return self._submit()
        probs = softmax([score(self.weights, c.features) for c in self.candidates])
        k = self.rng.choices(range(len(self.candidates)), weights=probs)[0]
        info = {"features": [list(c.features) for c in self.candidates], "chosen": k, "entropy": entropy(probs)}
        chosen = self.candidates.pop(k)
        info["family"] = chosen.family
        edits = [(chosen.path, chosen.line_no, chosen.new_line)]
        if self.applied is not None:
            edits.insert(0, (self.applied.path, self.applied.line_no, self.applied.old_line))
        self.applied = chosen
        self.attempts -= 1
        self.phase = "check"
        action = Action(tool="run", args={"command": _line_edit_command(edits)})
        return Decision(action, logprob=math.log(probs[k]), tokens_out=1, info=info)

    def _check(self, _: str) -> Decision:
        """The failing tests first (quick to refute an edit), then the whole suite (an edit may break another test).
        With no failing test in the workspace (they are hidden: the bug is only described) the suite alone refutes an
        edit that breaks what works; the first edit it does not refute is submitted.

        An edit can make a loop endless: each run is cut off well past the time the suite took, first by
        CPU time (``ulimit -t``, each pytest its own budget), which does not stretch on a loaded machine.
        """
        self.phase = "verdict"
        budget = 10 * self.evidence.suite_s
        pytest = f"timeout {max(10, math.ceil(budget))} python3 -m pytest -x -q -p no:cacheprovider"
        suite = f"{pytest} >/dev/null 2>&1"
        tests = " ".join(_quote(t) for t in self.evidence.failing_tests)
        checks = f"{pytest} {tests} >/dev/null 2>&1 && {suite}" if tests else suite
        return _run(f"ulimit -t {max(3, math.ceil(budget))}; {checks}; echo rc=$?")

    def _verdict(self, observation: str) -> Decision:
        if "rc=0" in observation:
            return self._submit()
        return self._edit()

    def _submit(self, _: str = "") -> Decision:
        self.phase = "submit"
        return Decision(Action(tool="submit"))


def candidates_seen(view: TaskView, observations: list[str]) -> tuple[list[Candidate], int]:
    """The candidate edits an episode builds from ``observations`` (what the environment answered it, in
    order), and how many it may try: its reading replayed, for analyses of recorded episodes."""
    episode = RepairEpisode([0.0] * N_FEATURES, view, 0, ATTEMPTS)
    episode.act("")  # the task's first observation: the policy starts with the tests whatever it says
    for answer in observations:
        if episode.phase in ("check", "verdict", "submit"):  # past its reading: the candidates are built
            break
        episode.act(answer)
    return (candidates(episode.functions, episode.evidence) if episode.functions else []), ATTEMPTS


def score(weights: list[float], features: tuple[float, ...]) -> float:
    return sum(w * f for w, f in zip(weights, features, strict=True))


def softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def entropy(probs: list[float]) -> float:
    """Shannon entropy in nats of a distribution (a zero-probability outcome adds nothing)."""
    return math.fsum(-p * math.log(p) for p in probs if p > 0)


def _run(command: str) -> Decision:
    return Decision(Action(tool="run", args={"command": command}))


def _called_names(text: str) -> list[str]:
    """Functions the test output or the issue calls: bare builtins and pytest helpers left out."""
    names = [name for dot, name in _CALL.findall(text) if dot or name not in _BUILTINS]
    return [n for n in dict.fromkeys(names) if n not in _TEST_HELPERS and not n.startswith("test")]


def _tested_module(test_id: str) -> str:
    """The library module a test module is named for (``tests/test_csvio.py::...``: ``csvio``), if any."""
    stem = test_id.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    name = stem.removeprefix("test_").removesuffix("_test")
    return name if name != stem and _telling(name) else ""


def _telling(word: str) -> bool:
    """A word of a test's name that could name a function (``balance`` of ``test_balance_as_of``, not ``as``)."""
    return len(word) >= 3 and word.isidentifier() and word not in _FILLER


def _quoted_names(text: str) -> list[str]:
    """Names the issue quotes (`` `slugify` ``, `` `Ledger.balance` ``: its last part), tests' names left out."""
    return [n for n in dict.fromkeys(_NAMED.findall(text)) if not n.startswith("test") and n not in _BUILTINS]


def _line_edit_command(edits: list[tuple[str, int, str]]) -> str:
    """Set whole lines by number (a line-addressed edit needs no unique context)."""
    script = (
        "import sys\n"
        "args = sys.argv[1:]\n"
        "for i in range(0, len(args), 3):\n"
        "    path, n, new = args[i], int(args[i + 1]), args[i + 2]\n"
        "    lines = open(path).read().split('\\n')\n"
        "    lines[n - 1] = new\n"
        "    open(path, 'w').write('\\n'.join(lines))\n"
    )
    args = " ".join(f"{_quote(p)} {n} {_quote(text)}" for p, n, text in edits)
    return f"python3 -c {_quote(script)} {args}"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


class RandomEditEpisode(RepairEpisode):
    """The baseline without localisation: the learner's kinds of edit on every line of up to ``MAX_VIEWS``
    library files chosen at random, sampled uniformly, each checked against the failing tests like the
    learner's."""

    def _locate(self, test_output: str) -> Decision:
        self.evidence.failing_tests = list(dict.fromkeys(_FAILED.findall(test_output)))
        self.phase = "listing"
        return _run("find . -name '*.py' -not -path './.*' | sort")

    def _listing(self, output: str) -> Decision:
        files = [p.removeprefix("./") for p in output.split() if p.endswith(".py")]
        files = [p for p in files if not is_test_path(p)]
        self.rng.shuffle(files)
        return self._view_files(files)

    def _read(self, listing: str) -> Decision:
        self.functions += viewed_functions(self.pending.pop(0), listing)
        if self.pending:
            return self._view_next()
        blank = (0.0,) * N_FEATURES  # every candidate scores the same: uniform
        self.candidates = [
            Candidate(fn.path, n, text, new, family, blank)
            for fn in self.functions
            for n, text in fn.lines.items()
            for family, new in line_edits(text, fn.unread)
        ]
        return self._edit()


class RandomEditPolicy:
    """Uniform single-token edits anywhere in the library (``rollout.policies: [random_edit]``): what the
    learner's localisation and training must beat. Never trained."""

    name = "random_edit"
    version = "baseline"

    def __init__(self, attempts: int = ATTEMPTS) -> None:
        self.attempts = attempts

    def begin(self, view: TaskView, seed: int) -> RandomEditEpisode:
        return RandomEditEpisode([0.0] * N_FEATURES, view, seed, self.attempts)


class RepairPolicy:
    """A linear scorer over candidate-edit features; ``weights`` are what training updates."""

    name = "repair"

    def __init__(self, weights: list[float] | None = None, version: str = "v0", attempts: int = ATTEMPTS) -> None:
        self.weights = list(weights) if weights is not None else [0.0] * N_FEATURES
        self.version = version
        self.attempts = attempts

    def begin(self, view: TaskView, seed: int) -> RepairEpisode:
        return RepairEpisode(list(self.weights), view, seed, self.attempts)
