"""The small learnable policy of the embedded demo: pick one repair edit among candidates.

It sees only what the environment shows: it runs the tests, reads the traceback
(or greps for functions the issue names), views the code around those places,
proposes single-line repair edits (flip a comparison, shift a constant, swap
arguments, ...) and samples one from a softmax over a linear score of each
edit's features. Training moves the weights toward the edits that earned reward.
It never sees the gold patch.
"""

from __future__ import annotations

import io
import math
import random
import re
import tokenize
from dataclasses import dataclass, field

from trialforge.rollout.env import Action
from trialforge.rollout.policies import Decision, TaskView
from trialforge.tasks.patches import is_test_path

FAMILIES = ("compare", "boolean", "negation", "constant", "arith", "builtin", "swap_args", "offset")
CONTEXT_FEATURES = ("on_failing_line", "near_failing_line", "in_named_function", "in_return")
N_FEATURES = len(FAMILIES) + len(CONTEXT_FEATURES)

_SWAPS = {
    "<": ["<=", ">"], "<=": ["<", ">="], ">": [">=", "<"], ">=": [">", "<="], "==": ["!="], "!=": ["=="],
    "and": ["or"], "or": ["and"], "+": ["-"], "-": ["+"], "*": ["/"], "/": ["*", "//"], "//": ["/"],
    "min": ["max"], "max": ["min"], "True": ["False"], "False": ["True"],
}  # fmt: skip
_FAMILY_OF = {
    **{op: "compare" for op in ("<", "<=", ">", ">=", "==", "!=")},
    "and": "boolean", "or": "boolean", "+": "arith", "-": "arith", "*": "arith", "/": "arith", "//": "arith",
    "min": "builtin", "max": "builtin", "True": "builtin", "False": "builtin",
}  # fmt: skip
_FRAME = re.compile(r'^(?:File "/work/)?([\w./-]+\.py)"?(?::|, line )(\d+)', re.MULTILINE)
_CALL2 = re.compile(r"(\b[\w.]+\()([^(),]+), ([^(),]+)(\))")
_NOT_CANDIDATES = frozenset(
    {"assert", "len", "str", "int", "float", "list", "dict", "set", "tuple", "print", "range", "isinstance",
     "raises", "approx", "sorted", "repr", "type", "getattr", "open", "Decimal", "Exception", "ValueError",
     "TypeError", "KeyError", "AssertionError", "main", "python3", "pytest"}
)  # fmt: skip
_OFFSET = re.compile(r"\s*[+-]\s*1\b")


@dataclass(frozen=True)
class Candidate:
    path: str
    line_no: int
    old_line: str
    new_line: str
    family: str
    features: tuple[float, ...]


def line_edits(line: str) -> list[tuple[str, str]]:
    """Single-token repair edits of one source line: (family, new line)."""
    edits: list[tuple[str, str]] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens = []
    for tok in tokens:
        if tok.start[0] != 1 or tok.end[0] != 1:
            continue
        lo, hi = tok.start[1], tok.end[1]
        for new in _SWAPS.get(tok.string, []):
            edits.append((_FAMILY_OF[tok.string], line[:lo] + new + line[hi:]))
        if tok.type == tokenize.NUMBER and tok.string.isdigit():
            for new in (int(tok.string) + 1, int(tok.string) - 1):
                if new >= 0:
                    edits.append(("constant", line[:lo] + str(new) + line[hi:]))
        if tok.string == "not":
            edits.append(("negation", line[:lo] + line[hi:].lstrip()))
    stripped = line.lstrip()
    for keyword in ("if ", "elif ", "while ", "return "):
        if stripped.startswith(keyword) and not stripped.startswith(keyword + "not "):
            at = len(line) - len(stripped) + len(keyword)
            edits.append(
                (
                    "negation",
                    line[:at]
                    + "not ("
                    + line[at:].rstrip().rstrip(":")
                    + ")"
                    + (":" if line.rstrip().endswith(":") else ""),
                )
            )
    for match in _CALL2.finditer(line):
        swapped = match.group(1) + match.group(3).strip() + ", " + match.group(2).strip() + match.group(4)
        edits.append(("swap_args", line[: match.start()] + swapped + line[match.end() :]))
    for match in _OFFSET.finditer(line):
        edits.append(("offset", line[: match.start()] + line[match.end() :]))
    return [(fam, new) for fam, new in dict.fromkeys(edits) if new != line]


def _features(family: str, line_no: int, failing: set[int], named: bool, line: str) -> tuple[float, ...]:
    onehot = [1.0 if family == f else 0.0 for f in FAMILIES]
    near = any(abs(line_no - f) <= 3 for f in failing)
    return (*onehot, float(line_no in failing), float(near), float(named), float(line.lstrip().startswith("return")))


@dataclass
class _Region:
    path: str
    start: int
    end: int
    failing: set[int] = field(default_factory=set)
    named: bool = False


class RepairEpisode:
    """One episode: test, locate, view, then up to ``attempts`` sampled edits, each checked against the failing tests.

    Each edit is one decision (a "token" for the loss): sampled from a softmax over
    the candidates not tried yet, with its log-probability and the features it was
    chosen from recorded, so training can recompute it under new weights.
    """

    def __init__(self, weights: list[float], view: TaskView, seed: int, attempts: int) -> None:
        self.weights = weights
        self.view = view
        self.rng = random.Random(seed)
        self.attempts = attempts
        self.regions: list[_Region] = []
        self.pending: list[_Region] = []
        self.candidates: list[Candidate] = []
        self.failing_tests: list[str] = []
        self.applied: Candidate | None = None
        self.phase = "test"

    def act(self, observation: str) -> Decision:
        handler = getattr(self, f"_{self.phase}")
        return handler(observation)

    def _test(self, _: str) -> Decision:
        self.phase = "locate"
        cmd = "python3 -m pytest -q --tb=short -p no:cacheprovider 2>&1 | tail -n 80"
        return Decision(Action(tool="run", args={"command": cmd}))

    def _locate(self, test_output: str) -> Decision:
        self.failing_tests = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+::\S+)", test_output, re.MULTILINE)))[:5]
        frames: dict[str, set[int]] = {}
        for path, line in _FRAME.findall(test_output):
            if not is_test_path(path):
                frames.setdefault(path.removeprefix("/work/"), set()).add(int(line))
        if frames:
            for path, lines in list(frames.items())[:3]:
                self.pending.append(_Region(path, max(min(lines) - 30, 1), max(lines) + 30, failing=set(lines)))
            return self._next_view()
        names = _called_names(test_output + "\n" + self.view.problem_statement)
        if not names:
            return self._submit()
        self.phase = "grep"
        pattern = "|".join(names)
        cmd = f"grep -rnE --include='*.py' '^\\s*def ({pattern})\\b' . | grep -v '/tests\\?/' | head -n 5"
        return Decision(Action(tool="run", args={"command": cmd}))

    def _grep(self, output: str) -> Decision:
        for path, line in re.findall(r"^\./([\w./-]+\.py):(\d+):", output, re.MULTILINE)[:3]:
            start = int(line)
            self.pending.append(_Region(path, start, start + 40, named=True))
        return self._next_view() if self.pending else self._submit()

    def _next_view(self) -> Decision:
        region = self.pending.pop(0)
        self.regions.append(region)
        self.phase = "read"
        return Decision(Action(tool="view", args={"path": region.path, "start": region.start, "end": region.end}))

    def _read(self, listing: str) -> Decision:
        region = self.regions[-1]
        for match in re.finditer(r"^\s*(\d+)  (.*)$", listing, re.MULTILINE):
            line_no, text = int(match.group(1)), match.group(2)
            for family, new in line_edits(text):
                feats = _features(family, line_no, region.failing, region.named, text)
                self.candidates.append(Candidate(region.path, line_no, text, new, family, feats))
        return self._next_view() if self.pending else self._edit()

    def _edit(self) -> Decision:
        """Sample an untried candidate; undo the previous attempt in the same command."""
        if not self.candidates or self.attempts == 0:
            return self._submit()
        scores = [sum(w * f for w, f in zip(self.weights, c.features, strict=True)) for c in self.candidates]
        top = max(scores)
        probs = [math.exp(s - top) for s in scores]
        k = self.rng.choices(range(len(self.candidates)), weights=probs)[0]
        info = {"features": [list(c.features) for c in self.candidates], "chosen": k}
        chosen = self.candidates.pop(k)
        info["family"] = chosen.family
        edits = [(chosen.path, chosen.line_no, chosen.new_line)]
        if self.applied is not None:
            edits.insert(0, (self.applied.path, self.applied.line_no, self.applied.old_line))
        self.applied = chosen
        self.attempts -= 1
        # Without a failing test to check against (the bug is only described), one edit is all we can judge.
        self.phase = "check" if self.failing_tests else "submit"
        action = Action(tool="run", args={"command": _line_edit_command(edits)})
        return Decision(action, logprob=math.log(probs[k] / sum(probs)), tokens_out=1, info=info)

    def _check(self, _: str) -> Decision:
        self.phase = "verdict"
        tests = " ".join(_quote(t) for t in self.failing_tests)
        return Decision(
            Action(
                tool="run",
                args={"command": f"python3 -m pytest -x -q -p no:cacheprovider {tests} >/dev/null 2>&1; echo rc=$?"},
            )
        )

    def _verdict(self, observation: str) -> Decision:
        if "rc=0" in observation:
            return self._submit()
        return self._edit()

    def _submit(self, _: str = "") -> Decision:
        self.phase = "submit"
        return Decision(Action(tool="submit"))


def _called_names(text: str) -> list[str]:
    """Functions a failing test or the issue calls: where to look when no traceback points into the code."""
    names = dict.fromkeys(re.findall(r"\b([A-Za-z_][A-Za-z0-9_]{2,})\(", text))
    return [n for n in names if n not in _NOT_CANDIDATES and not n.startswith("test")][:8]


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


class RepairPolicy:
    """A linear scorer over candidate-edit features; ``weights`` are what training updates."""

    name = "repair"

    def __init__(self, weights: list[float] | None = None, version: str = "v0", attempts: int = 3) -> None:
        self.weights = list(weights) if weights is not None else [0.0] * N_FEATURES
        self.version = version
        self.attempts = attempts

    def begin(self, view: TaskView, seed: int) -> RepairEpisode:
        return RepairEpisode(list(self.weights), view, seed, self.attempts)
