"""Problem statements for synthetic tasks: a user's bug report written from what the failing tests show.

The statement names the failing tests, the public function they call, the error or the value observed, phrased as
a bug report; validation adds what its runs before the fix showed, judged values hidden (``tasks.observed``). The
failing tests are hidden from the policy (their modules are the task's test patch), so the statement never shows
their code nor a value they expect: only what the code under test did. It never shows the changed line (original or
mutated), a library file's line number, or the mutation's family; a candidate whose statement cannot avoid them
gets none (:func:`write_statement` returns None) and is dropped rather than shipped.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from trialforge import pyast
from trialforge.tasks.mutations import Mutant
from trialforge.tasks.patches import is_test_path


@dataclass(frozen=True)
class Screened:
    """A candidate that broke at least one test, with the evidence the statement is written from."""

    mutant: Mutant
    broke: tuple[str, ...]
    log: str
    said: Mapping[str, str] = field(default_factory=dict)  # broken test -> its failure's exception line


@dataclass
class Failure:
    """What pytest showed for one failing test: the test's own lines and the error lines (``E ...``)."""

    test: str
    code: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")
_FRAME = re.compile(r"^(\S+\.py):\d+: in \S+")
_FILE_LINE = re.compile(r"([\w./-]+\.py)(?::|\", line |, line )\d+")
_WHERE = re.compile(r"^E\s+\+\s+where (.+?) = (.+)$")
_ASSERT_EQ = re.compile(r"^E\s+(?:AssertionError: )?assert (.+)$")
_EXCEPTION = re.compile(r"^E\s+([A-Za-z_][\w.]*(?:Error|Exception|Warning|Exit|Interrupt))\b:?\s*(.*)$")
_NOT_RAISED = re.compile(r"DID NOT RAISE <class '(?:[\w.]*\.)?(\w+)'>")
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_BOUND = re.compile(r"<bound method ([\w.]+) of <[^<>]*>>")
MAX_SHOWN_TESTS = 10
# "succeed", not "pass": a statement showing a changed line as a word is refused, and a mutant's line may be `pass`
EXPECTED = (
    "Expected: these tests succeed again, and the rest of the suite keeps working. They are not in your "
    "checkout: they run when your change is graded."
)
MAX_DETAILED = 3
MAX_LINE = 160


def parse_failures(log: str, tests: Sequence[str]) -> list[Failure]:
    """Failure sections of ``pytest -q --tb=short`` output for ``tests``, library frames left out."""
    by_name = {t.split("::", 1)[-1].replace("::", "."): t for t in tests}
    failures: list[Failure] = []
    current: Failure | None = None
    in_test_frame = False
    for line in log.splitlines():
        header = _SECTION.match(line)
        if header or line.startswith(("===", "---")):
            current = None
            if header and header.group(1) in by_name:
                current = Failure(by_name[header.group(1)])
                failures.append(current)
                in_test_frame = False
            continue
        if current is None:
            continue
        frame = _FRAME.match(line)
        if frame:
            in_test_frame = is_test_path(frame.group(1))
        elif line.startswith("E "):
            current.errors.append(line.rstrip())
        elif in_test_frame and line.strip():
            current.code.append(line.rstrip())
    return failures


def public_names(sources: dict[str, str]) -> dict[str, str]:
    """Public functions, classes and methods of the library: name -> how a user would write it."""
    found: dict[str, str] = {}
    for text in sources.values():
        for match in re.finditer(r"^(class|def) ([A-Za-z]\w*)", text, re.MULTILINE):
            found.setdefault(match.group(2), match.group(2))
        for cls in re.finditer(r"^class ([A-Za-z]\w*).*?(?=^\S|\Z)", text, re.MULTILINE | re.DOTALL):
            for method in re.finditer(r"^    def ([A-Za-z]\w*)", cls.group(0), re.MULTILINE):
                found.setdefault(method.group(1), f"{cls.group(1)}.{method.group(1)}")
    return found


def changed_lines(patch: str) -> list[str]:
    """The code lines a patch removes or adds (stripped, only those with a letter or digit in them)."""
    lines = []
    for line in patch.splitlines():
        if line.startswith(("+++", "---")) or not line.startswith(("+", "-")):
            continue
        text = line[1:].strip()
        if re.search(r"\w", text):
            lines.append(text)
    return lines


def leaks(text: str, lines: Iterable[str]) -> list[str]:
    """The code lines that appear in ``text`` as whole words (``pass`` is not found in ``passing``)."""
    return [line for line in lines if re.search(rf"(?<!\w){re.escape(line)}(?!\w)", text)]


def write_statement(repo: str, item: Screened, public: dict[str, str], secret: Sequence[str]) -> str | None:
    """A user's bug report built from the failing tests; None when it cannot avoid showing ``secret`` lines."""
    failures = parse_failures(item.log, item.broke)
    parsed = {f.test for f in failures}
    # a long run's log keeps only its last failures: the others are known by their exception line alone
    lost = [t for t in item.broke if t not in parsed]
    failures += [Failure(t, [], [f"E   {item.said[t]}"] if t in item.said else []) for t in lost]
    shown = [_clean(f, secret, item.mutant) for f in failures[:MAX_DETAILED]]
    subject = next((s for f in [*shown, *failures] if (s := _subject(f, public))), None)
    parts = [_title(repo, subject, shown), "", _intro(repo, item), "", f"Failing tests ({len(item.broke)}):"]
    parts += [f"- {_display(t)}" for t in item.broke[:MAX_SHOWN_TESTS]]
    if len(item.broke) > MAX_SHOWN_TESTS:
        parts.append(f"- ... and {len(item.broke) - MAX_SHOWN_TESTS} more")
    observed = next((o for f in shown if (o := _observed(f))), None)
    if observed:
        parts += ["", observed]
    parts += ["", EXPECTED]
    statement = "\n".join(parts) + "\n"
    if leaks(statement, secret) or item.mutant.family in statement or _FILE_LINE.search(_strip_tests(statement)):
        return None
    return statement


def _clean(failure: Failure, secret: Sequence[str], mutant: Mutant) -> Failure:
    """Drop lines that show changed code, name a library file position, or are too long to help."""

    def ok(line: str) -> bool:
        positions = [m.group(1) for m in _FILE_LINE.finditer(line)]
        return not leaks(line, secret) and all(is_test_path(p) for p in positions) and mutant.family not in line

    code = [_trim(line) for line in failure.code if ok(line)][-4:]
    errors = [_trim(line) for line in failure.errors if ok(line)][:6]
    return Failure(failure.test, code, errors)


def _trim(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…"


def _strip_tests(text: str) -> str:
    """``text`` without test-file positions (those are fine to show): what remains must name no file line."""
    return _FILE_LINE.sub(lambda m: "" if is_test_path(m.group(1)) else m.group(0), text)


def _display(test: str) -> str:
    return test.replace("<collection>:", "collecting ")


def _subject(failure: Failure, public: dict[str, str]) -> str | None:
    """The public function or method the failing test calls on its failing line, else the one its name mentions."""
    for line in failure.code:
        for name in _CALL.findall(line):
            if name in public:
                return public[name]
    test_name = failure.test.rsplit("::", 1)[-1]
    named = [name for name in public if re.search(rf"(?:^|_){re.escape(name)}(?:_|$|\[)", test_name)]
    return public[max(named, key=len)] if named else None


def _title(repo: str, subject: str | None, shown: list[Failure]) -> str:
    errors = [line for f in shown for line in f.errors]
    what = f"`{subject}`" if subject else f"`{repo}`"
    for line in errors:
        if missing := _NOT_RAISED.search(line):
            return f"{what} no longer raises {missing.group(1)}"
        if (exc := _EXCEPTION.match(line)) and exc.group(1) != "AssertionError":
            return f"{what} fails with {exc.group(1).rsplit('.', 1)[-1]}"
    return f"{what} gives wrong results"


_INTROS = (
    "Something in `{repo}` regressed: {count} of its own suite now {verb}.",
    "After updating to the current `{repo}` code, {count} in its test suite {verb}.",
    "`{repo}` misbehaves for me, and its test suite agrees: {count} {verb}.",
)


def _intro(repo: str, item: Screened) -> str:
    """One of a few phrasings, chosen by the mutant's digest: the same task always reads the same."""
    pick = int(item.mutant.digest, 16) % len(_INTROS)
    n = len(item.broke)
    count, verb = ("one test", "fails") if n == 1 else (f"{n} tests", "fail")
    return _INTROS[pick].format(repo=repo, count=count, verb=verb)


def _observed(failure: Failure) -> str | None:
    """'`f(x)` returns `A`, which is wrong.' when the assertion output shows what the code under test computed. What
    the test expects is never said: the test is hidden, and its expected value in the statement would be an answer
    to copy, not a behaviour to fix."""
    compared = next((m.group(1) for line in failure.errors if (m := _ASSERT_EQ.match(line))), None)
    if compared is None or compared.count(" == ") != 1:
        return None
    left, right = (_short(side) for side in compared.split(" == "))
    for line in failure.errors:
        where = _WHERE.match(line)
        if where and where.group(1) in (left, right):
            return f"`{_short(where.group(2))}` returns `{where.group(1)}`, which is wrong."
    shape = _assert_shape(failure.code)
    if shape is None:
        return None
    expr, is_call, literal_on_right = shape
    verb = "returns" if is_call else "is"
    return f"`{_short(expr)}` {verb} `{left if literal_on_right else right}`, which is wrong."


def _assert_shape(code: list[str]) -> tuple[str, bool, bool] | None:
    """For the test's ``assert expr == literal`` line: (expr's text, whether it is a call, literal on the right?)."""
    for line in reversed(code):
        text = line.strip()
        try:
            node = pyast.parse(text).body[0]
        except (SyntaxError, IndexError):
            continue
        test = node.test if isinstance(node, ast.Assert) else None
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            return None
        left, right = test.left, test.comparators[0]
        if _literal(left) != _literal(right):
            expr = right if _literal(left) else left
            return ast.get_source_segment(text, expr) or ast.unparse(expr), isinstance(expr, ast.Call), _literal(right)
        return None
    return None


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _short(text: str, limit: int = 120) -> str:
    text = _BOUND.sub(r"\1", text)  # pytest's repr of a bound method: its name, not the object's address
    return text if len(text) <= limit else text[: limit - 1] + "…"
