"""Values a policy can read: an expected value found where its code looks anchors no verdict.

A host-judged assertion anchors a task (``HostJudged.fail_to_pass_anchored``) because its expected value never enters
a sandbox: a forged report, or code special-casing the test's input, needs a value it cannot see. That holds only if
the value is nowhere else the policy looks. So validation reads what the policy can: the tree the task's tests run in
(snapshot and test patch) less the test modules the test patch hides, the episode's own copies of every file the test
patch changes or deletes (a test the fix takes ``xfail`` off is in the workspace as it was), and the statement; and
calibration counts a slot as no anchor when its expected value is readable there:

- **anywhere in a file that is not Python source**, or in a module's docstrings and comments: a data file links its
  answers to their inputs by layout, record or file name (``case7.out`` beside ``case7.in``) in ways no window of
  lines bounds, and an example in prose is an answer sheet (``>>> fib(30)`` then ``832040``);
- **in a Python module's code that also spells one of the test's inputs** (``inputs``: the constants of the test and
  of the module constants it reads, less the slot's own expected side): a skipped copy of the assertion, a table of
  cases. A module spelling the value with none of them (a fixture's amount that a balance sums to) holds what the
  code computes from what it is given;
- **as one of the test's own inputs**: an echo (``slugify("crème-brûlée") == "crème-brûlée"``) is guessed by
  returning the argument.

Files are read as code reads them one import away: decoded by their byte-order mark, as UTF-8 or else as Windows-1252,
line ends and Unicode normalised; compressed files and archives decompressed; a pickle's constants by disassembly (none
of it runs); NumPy arrays, Parquet tables and SQLite databases by value; every file's path is text too. Images,
documents, fonts and executables are skipped. A tree past the caps is not read further and every value counts as
readable. A value is looked for in each spelling a program writes it in (``spellings``): a number by its decimal
value and in hex, with thousands separators, a decimal comma, an exponent or as a percentage, letters beside it
allowed (``4071ms``); a string as is, JSON- or URL-escaped, or line by line (an indented or CRLF snapshot); a date or
time in ISO form, a datetime's date and time apart. Only distinctive values count: a number of three digits or more,
a string of four characters or more; ``21`` or ``"ok"`` are in any tree and as guessable as they are readable.

The rule is a spelling search, so it is complete only for the spellings above: an answer stored in a form none of
them reads (encrypted, base64, computed by a script of the repository) still anchors. docs/verification.md says so.
"""

from __future__ import annotations

import ast
import bz2
import codecs
import contextlib
import datetime
import decimal
import fractions
import gzip
import html
import io
import json
import lzma
import math
import operator
import pickle
import pickletools
import quopri
import re
import sqlite3
import tarfile
import tempfile
import tokenize
import unicodedata
import urllib.parse
import zipfile
import zlib
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import numpy
import pyarrow
import pyarrow.parquet

MAX_FILE_BYTES = 16 * 1024 * 1024  # past either cap the tree is not read further, and every value counts as readable
MAX_TOTAL_BYTES = 128 * 1024 * 1024
MIN_DIGITS = 3
MIN_CHARS = 4
_SKIPPED = frozenset({".git", "__pycache__", ".trialforge"})  # what snapshots leave out
_SOURCE = (".py", ".pyi")
_DEPTH = 4  # containers within containers read (a zip of tar.gz of json.gz: 4)
# images, documents, fonts, sound and executables: no value a test compares with is read off one
_MEDIA = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"%PDF", b"wOF", b"\x00\x01\x00\x00", b"OTTO", b"RIFF", b"\x7fELF")
_NUMBERS = (int, float, decimal.Decimal, fractions.Fraction)


class WorkspaceText:
    """What a policy can read, for ``answers``: Python modules' code apart from every other text (other files, the
    modules' docstrings and comments, file paths, the statement); ``cut``: the tree holds more than the caps, and
    every distinctive value counts as readable (a dataset past them is one the code can read and the host did not)."""

    def __init__(self, modules: list[str], data: list[str], cut: bool = False, folded: list[str] | None = None) -> None:
        self.modules, self.data, self.cut = modules, data, cut
        self.folded = folded or []  # each data text on one line, whitespace alike: searched whole, never by line

    @classmethod
    def of(
        cls,
        tree: Path,
        leave_out: Collection[str] = (),
        episode: Path | None = None,
        changed: Collection[str] = (),
        statement: str = "",
    ) -> WorkspaceText:
        """``tree``'s text less ``leave_out`` (the hidden test modules, blinded when graded); from ``episode`` (the
        workspace as the policy first sees it), the files at ``changed`` (the test patch's paths) as they are there;
        ``statement``."""
        modules: list[str] = []
        folded: list[str] = []
        data: list[str] = [_normal(statement)] if statement else []
        total, paths = 0, []
        files = [(p, p.relative_to(tree).as_posix()) for p in sorted(tree.rglob("*"))]
        if episode is not None:
            files += [(episode / rel, rel) for rel in changed if (episode / rel).is_file()]
        for path, rel in files:
            if _SKIPPED & set(rel.split("/")) or path.is_symlink() or not path.is_file():
                continue
            if path.is_relative_to(tree) and rel in leave_out:
                continue
            paths.append(rel)
            with path.open("rb") as handle:
                raw = handle.read(MAX_FILE_BYTES + 1)
            if raw.startswith(_MEDIA):
                continue
            text = text_of(raw[:MAX_FILE_BYTES])[:MAX_FILE_BYTES]
            total += len(text)
            if len(raw) > MAX_FILE_BYTES or len(text) >= MAX_FILE_BYTES or total > MAX_TOTAL_BYTES:
                return cls([], [], cut=True)
            if path.suffix in _SOURCE:
                modules.append(text + "\n" + _constants(text))
                data.append(_prose(text))
            else:
                data += _views(text)
                folded.append(" ".join(text.split()))  # a string folded over lines (YAML's ``>``)
        data.append("\n".join(paths))
        return cls(modules, [d for d in data if d], folded=folded)

    def answers(self, value: object, inputs: Collection[object], left: Collection[object] = ()) -> bool:
        """Whether ``value`` is readable (module docstring): as one of ``inputs`` (the test's own) or of ``left`` (the
        constants the graded test files keep: ``decode("MZXW6YTBOI======") == b"foobar"`` beside ``encode(b"foobar")``
        answers it at grading), or in a text that spells one of the distinctive inputs too (any text, when the test has
        none: its inputs come from elsewhere), a module's code counting only with such an input. A container is
        readable when each of its distinctive elements is, and a value when a line spells it beside a short numeric
        input (``fib(30)``). A short value (``== 3``) is never read: as guessable as readable."""
        telling = [given for given in inputs if distinctive(given)]
        if not distinctive(value):
            return False  # as guessable as readable (a short answer beside its input on a line: an open door)
        if self.cut:
            return True  # a tree past the caps, unread: any value may be in it
        if any(_same(value, given) for given in (*inputs, *left)):
            return True  # an echo of an input
        keyed = [text for text in (*self.data, *self.folded) if not telling or any(_spells(text, k) for k in telling)]
        keyed += [text for text in self.modules if any(_spells(text, key) for key in telling)]
        words = [_text(given) for given in inputs if isinstance(given, (str, bytes)) and _text(given).strip()]
        short = [g for g in inputs if isinstance(g, int) and not isinstance(g, bool) and not distinctive(g) and g >= 10]
        return _found(value, keyed, words) or any(self._beside(value, number) for number in short)

    def _beside(self, value: object, number: int) -> bool:
        """Whether a line of any text spells ``value`` and, apart from it, ``number`` as a whole number."""
        needle = _normal(_text(value)) if isinstance(value, (str, bytes)) else _canonical(str(value))
        for text in (*self.data, *self.modules):
            at = text.find(needle)
            while at >= 0:
                start, end = text.rfind("\n", 0, at) + 1, text.find("\n", at)
                if _spells(text[start : len(text) if end < 0 else end].replace(needle, " "), number):
                    return True
                at = -1 if end < 0 else text.find(needle, end)
        return False


def _found(value: object, texts: list[str], words: list[str]) -> bool:
    """Whether each distinctive part of ``value`` is spelled in ``texts``, on its own: a string inside one of the
    test's string inputs (``"Assets:Bank"`` in ``"Assets:Bank:Checking"``) is what the code picks out of what it is
    given, not an answer the text stores."""
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        items = list(value.items()) if isinstance(value, dict) else list(value)
        parts = [p for item in items for p in (item if isinstance(item, tuple) else (item,)) if distinctive(p)]
        return bool(parts) and all(_found(part, texts, words) for part in parts)
    if isinstance(value, (str, bytes)):
        inside = sorted((_normal(w) for w in words if _text(value) in w), key=len, reverse=True)  # as written
        if inside:
            texts = [_without(text, inside) for text in texts if _normal(_text(value)) in text]
    return any(_spells(text, value) for text in texts)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _without(text: str, words: list[str]) -> str:
    for word in words:
        text = text.replace(word, "\x00")
    return text


def text_of(raw: bytes, depth: int = 0) -> str:
    """What code reading ``raw`` with a common library sees, as text: a compressed file's or an archive's contents
    (each cut at ``MAX_FILE_BYTES``), a pickle's constants (read by disassembly: nothing of it runs), a NumPy array's,
    a Parquet table's or a SQLite database's values; any other file decoded (``_decoded``). A value stored so is as
    readable as one in a text file, one import away."""
    try:
        if depth < _DEPTH and raw.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")):
            opener = gzip.open if raw[:2] == b"\x1f\x8b" else bz2.open if raw[:3] == b"BZh" else lzma.open
            with opener(io.BytesIO(raw)) as stream:
                return text_of(stream.read(MAX_FILE_BYTES), depth + 1)
        if depth < _DEPTH and raw[:1] == b"\x78" and raw[1:2] in (b"\x01", b"\x5e", b"\x9c", b"\xda"):
            return text_of(zlib.decompressobj().decompress(raw, MAX_FILE_BYTES), depth + 1)
        if depth < _DEPTH and raw[257:262] == b"ustar":
            with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
                files = ((m.name, tar.extractfile(m)) for m in tar if m.isfile())
                return _members_text(((name, handle.read) for name, handle in files if handle), depth)
        if depth < _DEPTH and raw.startswith(b"PK\x03\x04"):
            with zipfile.ZipFile(io.BytesIO(raw)) as archive:
                files = ((m.filename, archive.open(m)) for m in archive.infolist() if not m.is_dir())
                return _members_text(((name, handle.read) for name, handle in files), depth)
        if raw.startswith(b"\x80") and raw[1:2] and raw[1] <= pickle.HIGHEST_PROTOCOL:
            return "\n".join(str(arg) for _op, arg, _pos in pickletools.genops(raw) if arg is not None)
        if raw.startswith(b"\x93NUMPY"):
            return "\n".join(map(str, numpy.load(io.BytesIO(raw), allow_pickle=False).ravel()[:1_000_000].tolist()))
        if raw.startswith(b"PAR1"):
            return str(pyarrow.parquet.read_table(pyarrow.BufferReader(raw)).to_pylist()[:100_000])
        if raw.startswith(b"SQLite format 3\x00"):
            return _sqlite_text(raw)
    except Exception:  # a file cut at the size cap, or not what its first bytes say: read as text
        pass
    return _decoded(raw)


def _members_text(members: Iterator[tuple[str, Callable[[int], bytes]]], depth: int) -> str:
    """An archive's members (name, read), each as ``text_of`` reads it, together as much as one file."""
    texts, left = [], MAX_FILE_BYTES
    for name, read in members:
        if left <= 0:
            break
        texts += [name, text_of(read(left), depth + 1)[:left]]
        left -= len(texts[-1])
    return "\n".join(texts)


def _sqlite_text(raw: bytes) -> str:
    """A SQLite database's rows, read from a private copy opened read-only (its own code never runs: no extension)."""
    with tempfile.NamedTemporaryFile(suffix=".sqlite3") as copy:
        copy.write(raw)
        copy.flush()
        connection = sqlite3.connect(f"file:{copy.name}?mode=ro", uri=True)
        try:
            return "\n".join(line for _, line in zip(range(1_000_000), connection.iterdump(), strict=False))
        finally:
            connection.close()


def _decoded(raw: bytes) -> str:
    """Text as an editor opens it: by its byte-order mark (UTF-16 and UTF-32 exports), as UTF-8, else as Windows-1252;
    line ends and Unicode normalised (NFC)."""
    for mark, codec in ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):  # fmt: skip
        if raw.startswith(mark):
            return _normal(raw.decode(codec, "replace"))
    if len(raw) >= 8 and raw[1::2].count(0) > len(raw) // 4:
        return _normal(raw.decode("utf-16-le", "replace"))  # UTF-16 with no mark: every other byte zero
    if len(raw) >= 8 and raw[0::2].count(0) > len(raw) // 4:
        return _normal(raw.decode("utf-16-be", "replace"))
    try:
        return _normal(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return _normal(raw.decode("cp1252", "replace"))


def _normal(text: str) -> str:
    """Line ends, Unicode form, minus signs and case as code that compares text would make them alike."""
    return unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\u2212", "-")).casefold()


def _views(text: str) -> list[str]:
    """A text and what it says once unescaped as JSON (``\\u00e8``, ``\\n``) and as a URL (``%C3%A8``)."""
    found = [text]
    if "\\" in text:
        found.append(_normal(re.sub(r"\\u[0-9a-fA-F]{4}|\\[nrt\"\\/]", _unescape, text)))
    if "%" in text:
        found.append(_normal(urllib.parse.unquote(text)))
    if "&" in text:
        found.append(_normal(html.unescape(text)))  # XML's and HTML's character references
    if re.search(r"=\n|=[0-9a-f]{2}", text):  # quoted-printable (mail, MIME fixtures)
        found.append(_normal(quopri.decodestring(text.encode("utf-8", "replace")).decode("utf-8", "replace")))
    return found


def _unescape(match: re.Match[str]) -> str:
    try:
        return json.loads(f'"{match.group()}"')
    except ValueError:
        return match.group()


def _prose(source: str) -> str:
    """A module's docstrings and comments: an example there is an answer sheet whatever the test's inputs."""
    found = []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                found.append(docstring)
    with contextlib.suppress(tokenize.TokenError, SyntaxError):
        found += [
            t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT
        ]
    return _normal("\n".join(found))


def _constants(source: str) -> str:
    """A module's constants as Python holds them: implicit concatenations joined, arithmetic on constants folded
    (``10 * 1024**2``), each on a line of its own."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and _foldable(node):
            with contextlib.suppress(Exception):  # 1 / 0, a type error: nothing to read
                found.append(str(_folded(node)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            found.append(_text(node.value))
    return _normal("\n".join(found))


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
              ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitOr: operator.or_,
              ast.BitAnd: operator.and_, ast.BitXor: operator.xor, ast.USub: operator.neg, ast.UAdd: operator.pos,
              ast.Invert: operator.invert}  # fmt: skip


def _folded(node: ast.expr) -> object:
    """The value of arithmetic on constants, computed here (compiling an AST object that fails to convert leaves
    CPython 3.11's AST state broken for every later parse in the process)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp):
        return _OPERATORS[type(node.op)](_folded(node.operand))
    assert isinstance(node, ast.BinOp)
    return _OPERATORS[type(node.op)](_folded(node.left), _folded(node.right))


def _foldable(node: ast.BinOp) -> bool:
    """Arithmetic on numeric constants alone whose result stays small: a power or a shift of two constants, the right
    one under 64 (so no power of a power)."""
    for part in ast.walk(node):
        if isinstance(part, ast.Constant) and not (isinstance(part.value, (int, float)) and abs(part.value) < 2**64):
            return False
        if (
            isinstance(part, ast.BinOp)
            and isinstance(part.op, (ast.Pow, ast.LShift))
            and isinstance(part.right, ast.Constant)
            and abs(part.right.value) >= 64
        ):
            return False
        if not isinstance(part, (ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop)):
            return False
        if (
            isinstance(part, ast.BinOp)
            and isinstance(part.op, (ast.Pow, ast.LShift))
            and not (isinstance(part.left, ast.Constant) and isinstance(part.right, ast.Constant))
        ):
            return False
    return True


def _same(value: object, given: object) -> bool:
    if (
        isinstance(value, bool)
        or isinstance(given, bool)
        or (type(value) is not type(given) and not (isinstance(value, _NUMBERS) and isinstance(given, _NUMBERS)))
    ):
        return False
    try:
        return bool(value == given)
    except Exception:  # a value whose comparison raises is no echo
        return False


def _spells(text: str, value: object) -> bool:
    """Whether ``text`` (``_normal``) spells ``value`` in one of the spellings a program writes it in."""
    if isinstance(value, bytes):
        if len(value) >= MIN_CHARS and (value.hex() in text or value[::-1].hex() in text):
            return True  # a known-answer file's hex, either byte order
        value = value.decode("utf-8", "replace")
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
        return _normal(str(value)) in text or any(_number_at(text, s) for s in _number_spellings(seconds))
    if isinstance(value, str) and "\n" in value.strip():
        lines = [_normal(line.strip()) for line in value.strip().splitlines() if line.strip()]
        return _normal(value) in text or all(line in text for line in lines)  # a snapshot, indented or listed
    if isinstance(value, datetime.datetime):
        day, time = value.date().isoformat(), value.time().isoformat()
        stamp = value.replace(tzinfo=value.tzinfo or datetime.UTC).timestamp()
        spelled = _normal(value.isoformat()) in text or (day in text and time in text)
        return spelled or (_spells(text, value.date()) and time in text) or _number_at(text, _canonical(str(stamp)))
    if isinstance(value, str) and _ISO_DATETIME.fullmatch(value):
        day, _, time = _normal(value).partition("t")
        return _normal(value) in text or (day in text and time in text)
    if isinstance(value, datetime.date):
        return any(_normal(value.strftime(form)) in text for form in _DATE_FORMS)
    if isinstance(value, datetime.time):
        return value.isoformat() in text or _normal(value.strftime("%I:%M %p")).lstrip("0") in text
    if isinstance(value, _NUMBERS) and not isinstance(value, bool):
        found = any(_number_at(text, spelling.casefold()) for spelling in _number_spellings(value))
        return found or (isinstance(value, float) and _float_at(text, value))
    return isinstance(value, str) and _normal(value) in text


def _float_at(text: str, value: float) -> bool:
    """Whether a number in ``text`` equals ``value`` as a float to 1e-9, in any notation (``843.79999999999995``,
    ``8.4380E+02``, Fortran's ``0.8438D+03``)."""
    lead = re.sub(r"^[0.]+", "", f"{abs(value):.17e}".replace(".", ""))[:3]
    for match in _FLOAT.finditer(text):
        token = match.group()
        if lead not in token.replace(".", "")[:8]:
            continue
        with contextlib.suppress(ValueError):
            if math.isclose(float(token.replace("d", "e")), value, rel_tol=1e-9):
                return True
    return False


_FLOAT = re.compile(r"(?<![\d.])-?(?:\d+\.\d*|\.\d+|\d+)(?:[ed][-+]?\d+)?(?![\d.])")
_ISO_DATETIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d+)?)?")
# ISO, US, European, compact and written-out dates
_DATE_FORMS = ("%Y-%m-%d", "%m/%d/%Y", "%d/%m/%Y", "%d.%m.%Y", "%Y%m%d", "%B %d, %Y", "%b %d, %Y", "%d %B %Y")


def _number_spellings(value: int | float | decimal.Decimal | fractions.Fraction) -> Iterator[str]:
    """The ways a program writes ``value``: decimal (trailing zeros dropped: matched by value), hex, thousands
    separators, a decimal comma, NumPy's ``%.18e``, a percentage."""
    try:
        exact = decimal.Decimal(value) if not isinstance(value, fractions.Fraction) else None
    except (ValueError, TypeError, decimal.InvalidOperation):
        exact = None
    plain = _canonical(str(value)) if exact is None else _canonical(str(exact if isinstance(value, int) else value))
    yield plain
    if "." in plain:
        yield plain.replace(".", ",")
    if isinstance(value, int) and abs(value) >= 256:
        for spelled in dict.fromkeys((f"{abs(value):x}", f"{abs(value):08x}", f"{abs(value):X}", f"{abs(value):08X}")):
            yield "0x" + spelled
            if not spelled.isdigit():  # bare hex all of digits would read as another decimal number
                yield spelled
    if abs(float(value)) >= 1000:
        whole, dot, fraction = plain.partition(".")
        grouped = f"{int(whole):,}"
        for mark in (",", "_", ".", " ", "\u202f", "\xa0", "'"):
            yield grouped.replace(",", mark) + (("," if mark == "." else ".") + fraction if dot else "")
    if plain.startswith("-"):  # accounting's (1,234) and a trailing minus (1.234,00-)
        for spelled in [plain[1:], *(f"{int(abs(float(value))):,}".replace(",", m) for m in (",", "."))]:
            yield f"({spelled})"
            yield f"{spelled}-"
    if isinstance(value, float):
        yield f"{value:.18e}"
        yield f"{value:e}"
        if 0 < abs(value) < 10:
            yield _canonical(str(decimal.Decimal(str(value)) * 100)) + "%"


def _number_at(text: str, spelling: str) -> bool:
    """Whether ``text`` holds ``spelling`` as a whole number: no digit right before it, nor a fraction of its own after
    it other than zeros (``4071.00`` spells 4071); letters may touch a decimal spelling (``4071ms``, ``A4071``), a hex
    one is a word of its own."""
    point = "," if "," in spelling and "." not in spelling else "."
    body = spelling.lstrip("-")
    for match in re.finditer(re.escape(body), text):
        start, end = match.start(), match.end()
        before, after = text[max(0, start - 2) : start], text[end:]
        if before[-1:].isdigit() or (before[-1:] == point and before[:1].isdigit()):
            continue  # the tail of a longer number, or its fraction
        if spelling.startswith("-") != (before[-1:] == "-"):
            continue
        digits = re.match(r"\d*", after[1:] if after[:1] == point else after)
        more = digits.group() if digits else ""
        if after[:1].isdigit() and not (point in body and set(more) <= {"0"}):
            continue
        if after[:1] == point and more and set(more) != {"0"}:
            continue
        if not body.isdigit() and point not in body and (before[-1:].isalnum() or after[:1].isalnum()):
            continue  # a hex spelling is a word of its own
        return True
    return False


def distinctive(value: object) -> bool:
    """A value spelled rarely enough to be told apart from the numbers and words any text holds."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, _NUMBERS):
        return sum(c.isdigit() for c in _canonical(str(value))) >= MIN_DIGITS
    if isinstance(value, (str, bytes)):
        return len(value.strip()) >= MIN_CHARS
    if isinstance(value, (datetime.date, datetime.time, datetime.timedelta)):
        return True
    return isinstance(value, (list, tuple, set, frozenset, dict))


def _canonical(number: str) -> str:
    """``957.90`` and ``957.9`` alike: the decimal value, trailing zeros dropped."""
    try:
        return format(decimal.Decimal(number).normalize(), "f")
    except decimal.InvalidOperation:
        return number
