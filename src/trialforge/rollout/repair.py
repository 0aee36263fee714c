"""The small learnable policy of the embedded demo: pick repair edits among candidates.

It sees only what the environment shows. It runs the tests; when some fail it runs
them again under a line tracer (which lines each failing and passing test executed:
spectrum-based fault localisation), otherwise it greps for the functions the issue
names. It views the implicated files, proposes single-line repair edits (flip a
comparison, shift a constant, swap arguments, put back a name the function binds
but never reads, ...) on the implicated lines, and
samples edits from a softmax over a linear score of each edit's features: what kind
of edit, on what kind of line, how suspicious the line's test coverage is, and how
its function is tied to the failure. Each edit is checked against the failing tests,
then the whole suite; a refuted edit is undone before the next is tried. Training
moves the weights toward the edits that earned reward; the features are shared by
every task, so what one task teaches ranks the next one's edits. It never sees the
gold patch, the test patch or the task's list of failing tests.
"""

from __future__ import annotations

import ast
import io
import itertools
import math
import random
import re
import textwrap
import tokenize
from dataclasses import dataclass, field

from trialforge import pyast
from trialforge.rollout.env import Action
from trialforge.rollout.policies import Decision, TaskView
from trialforge.tasks.patches import is_test_path

# Kinds of edit. A ``negation`` adds a ``not``, an ``unnegate`` removes one: few lines hold a ``not``, so
# removing it is a far likelier fix than adding one anywhere, and one weight for both could not say so.
# ``return_name`` and ``add_argument`` put back a name the function binds but never reads (a dropped
# return value or argument leaves one behind, the way a linter's "unused variable" points at a bug).
FAMILIES = (
    "compare", "boolean", "negation", "constant", "arith", "callee", "swap_args", "offset",
    "unnegate", "return_name", "add_argument",
)  # fmt: skip
CONTEXT_FEATURES = (
    "suspiciousness",  # Ochiai: failing tests that ran the line / sqrt(all failing x all that ran it)
    "most_suspicious",  # the line ties for the highest suspiciousness among the candidates
    "run_by_passing",  # share of the passing tests that ran the line
    "on_traceback_line", "in_traceback_function", "named_in_output", "test_name_match",
    "in_condition", "in_return", "in_loop",
)  # fmt: skip
FEATURES = FAMILIES + CONTEXT_FEATURES
N_FEATURES = len(FEATURES)

_SWAPS = {
    "<": ["<=", ">"], "<=": ["<", ">="], ">": [">=", "<"], ">=": [">", "<="], "==": ["!="], "!=": ["=="],
    "is": ["is not"], "and": ["or"], "or": ["and"], "+": ["-"], "-": ["+"], "*": ["/"], "/": ["*", "//"],
    "//": ["/"], "+=": ["-="], "-=": ["+="], "True": ["False"], "False": ["True"],
}  # fmt: skip
_FAMILY_OF = {
    **{op: "compare" for op in ("<", "<=", ">", ">=", "==", "!=", "is")},
    "and": "boolean", "or": "boolean", "True": "constant", "False": "constant",
    **{op: "arith" for op in ("+", "-", "*", "/", "//", "+=", "-=")},
}  # fmt: skip
# Functions and methods that are easily confused with their twin.
_TWINS = dict(
    pair
    for a, b in [
        ("min", "max"), ("any", "all"), ("lower", "upper"), ("startswith", "endswith"), ("lstrip", "rstrip"),
        ("find", "rfind"), ("index", "rindex"), ("floor", "ceil"), ("append", "extend"), ("keys", "values"),
        ("bisect_left", "bisect_right"), ("insort_left", "insort_right"), ("removeprefix", "removesuffix"),
        ("ljust", "rjust"),
    ]
    for pair in ((a, b), (b, a))
)  # fmt: skip
_OFFSET = re.compile(r"\s*[+-]\s*1\b")
# Library frames, in pytest's short form ("pkg/mod.py:12: in func") or a plain traceback's.
_FRAME = re.compile(r'^\s*(?:File "(?:/work/)?)?([\w./-]+\.py)"?(?::|, line )(\d+)(?::|,) in (\w+)', re.MULTILINE)
_FAILED = re.compile(r"^(?:FAILED|ERROR) ([\w./-]+\.py::\w+)", re.MULTILINE)
_CALL = re.compile(r"(\.?)\b([A-Za-z_]\w*)\s*\(")
_DEF = re.compile(r"^(\s*)(?:async\s+)?def\s+(\w+)")
_LISTING = re.compile(r"^\s*(\d+)  (.*)$", re.MULTILINE)
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


@dataclass(frozen=True)
class Candidate:
    path: str
    line_no: int
    old_line: str
    new_line: str
    family: str
    features: tuple[float, ...]


def line_edits(line: str, unread: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Repair edits of one source line, one token changed or an unread name put back: (family, new line);
    edits that break the syntax are left out.

    ``unread``: names the line's function binds (parameters, assignments) and never reads; each may become
    the value returned, or a call's last argument (positional, or ``name=name``).
    """
    edits: list[tuple[str, str]] = []
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(line).readline) if t.start[0] == t.end[0] == 1]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens = []
    for i, tok in enumerate(tokens):
        lo, hi = tok.start[1], tok.end[1]
        for new in _SWAPS.get(tok.string, []):
            edits.append((_FAMILY_OF[tok.string], line[:lo] + new + line[hi:]))
        if tok.string == "in" and (i == 0 or tokens[i - 1].string != "not") and " for " not in f" {line[:lo]}":
            edits.append(("compare", line[:lo] + "not in" + line[hi:]))
        if tok.type == tokenize.NAME and tok.string in _TWINS:
            edits.append(("callee", line[:lo] + _TWINS[tok.string] + line[hi:]))
        if tok.type == tokenize.NUMBER and tok.string.isdigit():
            for new in _constant_edits(int(tok.string)):
                edits.append(("constant", line[:lo] + str(new) + line[hi:]))
        if tok.string == "not":
            edits.append(("unnegate", line[:lo] + line[hi:].lstrip()))
    calls = _calls(line, tokens)
    edits += _negations(line) + _arg_swaps(line, calls) + _names_put_back(line, calls, unread)
    edits += [("offset", line[: m.start()] + line[m.end() :]) for m in _OFFSET.finditer(line)]
    parses = statement(line) is not None
    return [(fam, new) for fam, new in dict.fromkeys(edits) if new != line and (not parses or statement(new))]


def _constant_edits(value: int) -> list[int]:
    """An integer literal moved by one, or set to 0 or 1 (the values an off-by-some constant most often should be)."""
    return [v for v in dict.fromkeys((value + 1, value - 1, 0, 1)) if v >= 0 and v != value]


def _negations(line: str) -> list[tuple[str, str]]:
    """The whole condition of an ``if``/``elif``/``while``/``return`` negated."""
    stripped = line.lstrip()
    for keyword in ("if ", "elif ", "while ", "return "):
        if stripped.startswith(keyword) and not stripped.startswith(keyword + "not "):
            at = len(line) - len(stripped) + len(keyword)
            body = line[at:].rstrip()
            colon = ":" if body.endswith(":") else ""
            return [("negation", f"{line[:at]}not ({body.removesuffix(':')}){colon}")]
    return []


@dataclass(frozen=True)
class _Call:
    """A call that opens and closes on one line: its name and the column spans of its arguments."""

    name: str
    args: list[tuple[int, int]]
    close: int  # column of the closing parenthesis


def _calls(line: str, tokens: list[tokenize.TokenInfo]) -> list[_Call]:
    calls = []
    for i, tok in enumerate(tokens):
        if tok.string != "(" or i == 0 or tokens[i - 1].type != tokenize.NAME or tokens[i - 1].string in ("if", "in"):
            continue
        args, depth, start = [], 0, tok.end[1]
        for t in tokens[i + 1 :]:
            if t.type == tokenize.OP and t.string in ("(", "[", "{"):
                depth += 1
            elif t.type == tokenize.OP and t.string in (")", "]", "}"):
                if depth == 0:
                    if line[start : t.start[1]].strip():
                        args.append((start, t.start[1]))
                    calls.append(_Call(tokens[i - 1].string, args, t.start[1]))
                    break
                depth -= 1
            elif t.string == "," and depth == 0:
                args.append((start, t.start[1]))
                start = t.end[1]
    return calls


# Calls whose positional arguments commute: swapping them changes nothing, an attempt wasted.
_COMMUTATIVE = frozenset({"min", "max"})


def _arg_swaps(line: str, calls: list[_Call]) -> list[tuple[str, str]]:
    """Adjacent positional arguments of a call on this line exchanged (every pair of neighbours)."""
    edits = []
    for call in calls:
        if call.name in _COMMUTATIVE:
            continue
        for (a0, a1), (b0, b1) in itertools.pairwise(call.args):
            a, b = line[a0:a1].strip(), line[b0:b1].strip()
            if a and b and a != b and "=" not in a + b and "*" not in a[:1] + b[:1]:
                swapped = line[:a0] + line[a0:a1].replace(a, b) + line[a1:b0] + line[b0:b1].replace(b, a) + line[b1:]
                edits.append(("swap_args", swapped))
    return edits


def _names_put_back(line: str, calls: list[_Call], unread: tuple[str, ...]) -> list[tuple[str, str]]:
    """A name bound but never read returned instead of the line's value, or passed as a call's last argument."""
    edits = []
    stripped = line.lstrip()
    if stripped == "return" or stripped.startswith("return "):
        indent = line[: len(line) - len(stripped)]
        edits += [("return_name", f"{indent}return {name}") for name in unread]
    for call in calls:
        passed = {line[a0:a1].strip() for a0, a1 in call.args}
        head, tail = line[: call.close].rstrip(), line[call.close :]
        sep = ", " if call.args else ""
        for name in unread:
            if name not in passed:
                edits += [("add_argument", f"{head}{sep}{arg}{tail}") for arg in (name, f"{name}={name}")]
    return edits


def statement(line: str) -> str | None:
    """One line read as a statement on its own (a block header given a body), dumped; None if it is not one."""
    text = line.strip()
    text = "if" + text[4:] if text.startswith("elif") else text
    for attempt in (text, text + " pass"):
        try:
            return ast.dump(pyast.parse(attempt))
        except SyntaxError:
            continue
    return None


@dataclass(frozen=True)
class ViewedFunction:
    """A function the policy viewed, with its own lines (a nested function's are apart)."""

    path: str
    name: str
    lines: dict[int, str]
    unread: tuple[str, ...]  # parameters and locals it binds but never reads


@dataclass
class _Evidence:
    """What the environment showed about the failure."""

    failing_tests: list[str] = field(default_factory=list)
    frames: dict[str, set[int]] = field(default_factory=dict)  # library path -> traceback lines
    frame_functions: set[str] = field(default_factory=set)
    output_names: set[str] = field(default_factory=set)  # functions the test output or the issue calls
    test_words: list[set[str]] = field(default_factory=list)  # words of each failing test's name
    spectrum: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # line -> (failing, passing)
    totals: tuple[int, int] = (0, 0)  # tests that failed, passed under the tracer
    suite_s: float = 0.0  # how long the suite took, as pytest reported it

    def suspiciousness(self, path: str, line: int) -> float:
        failing, passing = self.spectrum.get((path, line), (0, 0))
        return failing / math.sqrt(max(self.totals[0], failing) * (failing + passing)) if failing else 0.0


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
        self.evidence = _Evidence()
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
        ev.output_names = set(_called_names(test_output + "\n" + self.view.problem_statement))
        ev.suite_s = max((float(s) for s in _DURATION.findall(test_output)), default=0.0)
        if ev.failing_tests:
            self.phase = "spectrum"
            return _run(f"python3 -c {_quote(SPECTRUM_SCRIPT)} 2>&1 | head -n 150")
        if not ev.output_names:  # nothing fails and the issue names no function: nothing to go on
            return self._submit()
        self.phase = "grep"
        pattern = "|".join(sorted(ev.output_names))
        return _run(f"grep -rnE --include='*.py' '^\\s*(async\\s+)?def ({pattern})\\b' . | head -n 20")

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
        return self._view_files(list(dict.fromkeys(hits)))

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
        self.candidates = _candidates(self.functions, self.evidence)
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
        # Without a failing test to check against (the bug is only described), one edit is all we can judge.
        self.phase = "check" if self.evidence.failing_tests else "submit"
        action = Action(tool="run", args={"command": _line_edit_command(edits)})
        return Decision(action, logprob=math.log(probs[k]), tokens_out=1, info=info)

    def _check(self, _: str) -> Decision:
        """The failing tests first (quick to refute an edit), then the whole suite (an edit may break another test).

        An edit can make a loop endless: each run is cut off well past the time the suite took, first by
        CPU time (``ulimit -t``, each pytest its own budget), which does not stretch on a loaded machine.
        """
        self.phase = "verdict"
        budget = 10 * self.evidence.suite_s
        pytest = f"timeout {max(10, math.ceil(budget))} python3 -m pytest -x -q -p no:cacheprovider"
        tests = " ".join(_quote(t) for t in self.evidence.failing_tests)
        checks = f"{pytest} {tests} >/dev/null 2>&1 && {pytest} >/dev/null 2>&1"
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
    attempts = ATTEMPTS if episode.evidence.failing_tests else 1
    return (_candidates(episode.functions, episode.evidence) if episode.functions else []), attempts


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


def viewed_functions(path: str, listing: str) -> list[ViewedFunction]:
    """The functions of a viewed file (a ``view`` listing), each with its own lines."""
    lines = {int(n): text for n, text in _LISTING.findall(listing)}
    found = []  # (indent, def line, function)
    for n, text in lines.items():
        if match := _DEF.match(text):
            indent = len(match.group(1))
            body = _body(lines, n, indent)
            unread = _unread(lines, n, max(body, default=n))
            found.append((indent, n, ViewedFunction(path, match.group(2), body, unread)))
    for indent, _, fn in found:  # a nested function's lines are its own
        for inner_indent, inner_n, inner in found:
            if inner_indent > indent and inner_n in fn.lines:
                for m in [inner_n, *inner.lines]:
                    fn.lines.pop(m, None)
    return [fn for _, _, fn in found]


def _unread(lines: dict[int, str], first: int, last: int) -> tuple[str, ...]:
    """Names the function on lines ``first..last`` binds (parameters, assignment and loop targets) and never
    reads, nested functions' reads included; none when its text does not parse on its own."""
    text = textwrap.dedent("\n".join(lines.get(m, "") for m in range(first, last + 1)))
    try:
        fn = pyast.parse(text).body[0]
    except (SyntaxError, IndexError):
        return ()
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return ()
    args = fn.args
    bound = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    read = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            (bound.append if isinstance(node.ctx, ast.Store) else read.add)(node.id)
    skip = {"self", "cls", "_"}
    return tuple(name for name in dict.fromkeys(bound) if name not in read and name not in skip)


def _body(lines: dict[int, str], first: int, indent: int) -> dict[int, str]:
    """The lines of the block opened at ``first``: after its header (which may span lines), until it dedents."""
    start = first
    while start in lines and not re.sub(r"#.*", "", lines[start]).rstrip().endswith(":"):
        start += 1
    body = {}
    for m in range(start + 1, max(lines) + 1):
        line = lines.get(m, "")
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body[m] = line
    return body


def _candidates(functions: list[ViewedFunction], ev: _Evidence) -> list[Candidate]:
    """Edits on the implicated lines: those a failing test ran, else those of the functions the issue names."""
    if ev.spectrum:
        lines = [(fn, n, text) for fn in functions for n, text in fn.lines.items() if (fn.path, n) in ev.spectrum]
    else:
        lines = [(fn, n, text) for fn in functions if fn.name in ev.output_names for n, text in fn.lines.items()]
    top = max((ev.suspiciousness(fn.path, n) for fn, n, _ in lines), default=0.0)
    candidates = []
    for fn, n, text in lines:
        suspicious = ev.suspiciousness(fn.path, n)
        passing = ev.spectrum.get((fn.path, n), (0, 0))[1] / max(ev.totals[1], 1)
        frames = ev.frames.get(fn.path, set())
        tied = (
            float(n in frames),
            float(fn.name in ev.frame_functions),
            float(fn.name in ev.output_names),
            max((_overlap(set(fn.name.split("_")), words) for words in ev.test_words), default=0.0),
        )
        spectrum = (suspicious, float(suspicious > 0 and suspicious == top), passing)
        for family, new in line_edits(text, fn.unread):
            onehot = tuple(1.0 if family == f else 0.0 for f in FAMILIES)
            candidates.append(Candidate(fn.path, n, text, new, family, onehot + spectrum + tied + _line_kind(text)))
    return candidates


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


def _line_kind(line: str) -> tuple[float, float, float]:
    """Whether the line holds a condition, a return, a loop."""
    stripped = line.lstrip()
    condition = stripped.startswith(("if ", "elif ", "while ")) or " if " in stripped
    loop = stripped.startswith("for ") or " for " in stripped
    return float(condition), float(stripped.startswith("return")), float(loop)


def _called_names(text: str) -> list[str]:
    """Functions the test output or the issue calls: bare builtins and pytest helpers left out."""
    names = [name for dot, name in _CALL.findall(text) if dot or name not in _BUILTINS]
    return [n for n in dict.fromkeys(names) if n not in _TEST_HELPERS and not n.startswith("test")]


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
