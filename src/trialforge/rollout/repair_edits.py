"""The repair policy's candidate edits: single-line repairs of the lines the evidence implicates, with features.

``line_edits`` proposes the edits of one source line: flip a comparison, shift a constant, swap arguments,
negate a condition, put back a name the function binds but never reads, ... . ``candidates`` makes them on
the implicated lines of the functions an episode viewed (those a failing test ran, else those the issue
names), each with the features the policy scores it by: what kind of edit, on what kind of line, how
suspicious the line's test coverage is (``Evidence``), and how its function is tied to the failure.
"""

from __future__ import annotations

import ast
import io
import itertools
import math
import re
import textwrap
import tokenize
from dataclasses import dataclass, field

from trialforge import pyast

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
_DEF = re.compile(r"^(\s*)(?:async\s+)?def\s+(\w+)")
_LISTING = re.compile(r"^\s*(\d+)  (.*)$", re.MULTILINE)
_CALLED = re.compile(r"(?:\bself\.|(?<![\w.]))([A-Za-z_]\w*)\s*\(")  # a call by bare name or on self


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
class Evidence:
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


def candidates(functions: list[ViewedFunction], ev: Evidence) -> list[Candidate]:
    """Edits on the implicated lines: those a failing test ran, else those of the functions the issue names and of
    the functions those call (a bug in a helper shows through the function the issue names)."""
    if ev.spectrum:
        lines = [(fn, n, text) for fn in functions for n, text in fn.lines.items() if (fn.path, n) in ev.spectrum]
    else:
        named = [fn for fn in functions if fn.name in ev.output_names or _named_like(fn.name, ev.test_words)]
        called = {m.group(1) for fn in named for text in fn.lines.values() for m in _CALLED.finditer(text)}
        implicated = [fn for fn in functions if fn in named or fn.name in called]
        # a module viewed for its name alone (no function in it named): all its functions are suspects
        implicated += [fn for fn in functions if not any(n.path == fn.path for n in named) and fn not in implicated]
        lines = [(fn, n, text) for fn in implicated for n, text in fn.lines.items()]
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


def _named_like(name: str, test_words: list[set[str]]) -> bool:
    """Whether a function's name shares a word with a failing test's (``balance`` and ``test_balance_as_of``)."""
    return any(len(w) >= 3 and w in words for w in name.split("_") for words in test_words)


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


def _line_kind(line: str) -> tuple[float, float, float]:
    """Whether the line holds a condition, a return, a loop."""
    stripped = line.lstrip()
    condition = stripped.startswith(("if ", "elif ", "while ")) or " if " in stripped
    loop = stripped.startswith("for ") or " for " in stripped
    return float(condition), float(stripped.startswith("return")), float(loop)
