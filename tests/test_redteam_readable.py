"""Red team (design-only attacker): the readability rule (``tasks/visible.py``) attacked from its description alone.

The rule, as the brief and docs/verification.md state it: validation reads the tree the task's tests run in (snapshot
and test patch, less the test modules the patch hides); a host-judged expected value anchors nothing when any file
that is not Python source spells it (distinctive spellings: 3+ digit numbers by decimal value, 4+ character strings
by substring), or a Python module spells it and one of the test function's input literals; each file cut at 4 MB,
64 MB in all. ``visible.py``, ``calibration.py`` and ``blinding.py`` were not read; ``WorkspaceText.of(...).answers``
was called as a black box (the pure test at the end).

The harness: a tiny ``kit`` package, one mined task per attack (``_mine``: base tree with the bug, fixed tree with the
gold and the hidden test module, ``validate_task`` with bwrap), the pipeline's **whole default quality gate**
(``run_quality_gate``: host_judged, weak_tests, leaks, shortcuts) and the grader. Each attack task is honest (its gold
scores 1, the empty diff 0: asserted), and the attack's diff leaves the bug in and answers the hidden test's one input
from what the workspace (or graded sandbox) holds. A test fails when the gate keeps the task AND that diff scores 1.

**All 29 wins are closed since** (the rule as docs/verification.md now states it, ``tasks/visible.py``): files read
as code reads them (decoded by BOM, UTF-8 or Windows-1252; case, line ends and NFC alike; JSON and URL escapes undone;
gzip, zip, pickle, NumPy, Parquet and SQLite by value; paths), numbers and dates in the spellings programs write,
snapshots line by line, module prose alone, an echo of the input, the statement, the episode's copies of what the
test patch changes, the module constants a test reads as its inputs, a tree past the caps as wholly readable. Every
attack below now finds its task dropped; the costs stay dropped (one more: ``compose_port``'s bare control, whose
package table now spells ``'https'`` as the test's ``'HTTPS'``). Round 2: ``tests/test_redteam_readable2.py``.

**Run of 2026-12-08 (before): 29 of 30 attacks win** (25 of 26 parametrized, 2 pre-patch, the issue text, synthesis);
each is a kept task on which a diff that does not fix the bug scores **1.0**:

Compressed or binary containers (the rule reads bytes as UTF-8 text):
 1. ``gzip``: ``tests/data/adler32.json.gz`` holds ``["Wikipedia", 300286872]``; ``adler(b"Wikipedia") == 300286872``.
 2. ``sqlite``: ``tests/fixtures/invoices.sqlite3`` (integers stored binary): ``gross(25999) == 30939``.
 3. ``pickle``: ``tests/data/scores.pkl`` ``{(1500, 271): 4229}``: ``score(1500, 271) == 4229``.
 4. ``past_the_budget``: ``tests/fixtures/thumbnails.json`` spells ``[1024, 768]`` plainly, after 66 MiB of photos
    that sort before it (``tests/fixtures/images/``): the 64 MB budget is spent first (with 10 MiB: dropped).
 5. ``big_file``: a 5.4 MB ``conversions.csv`` whose row ``987654,987654000`` lies past the 4 MB cut.
Text the rule reads but in another spelling:
 6. ``hex_sums``: ``tests/data/CRC32SUMS`` in sha256sum form (``0d4a1185  hello world``): ``== 222957957``.
 7. ``hex_module``: ``benchmarks/bench_crc.py`` spells the input and ``0x414FA339`` (a module: input is there, the
    value in hex).
 8. ``json_escapes``: ``json.dump``'s default ``ensure_ascii`` writes ``cr\\u00e8me-br\\u00fbl\\u00e9e-...``.
 9. ``snapshot_newlines``: a JSON snapshot of a multi-line string (``\\n`` escaped).
10. ``syrupy_amber``: a syrupy ``.ambr`` snapshot (every line of the string indented two spaces).
11. ``crlf``: a golden file checked in with CRLF line ends (``read_text()`` gives the LF string back).
12. ``decimal_comma``: German CSV ``1139,99;957,97``: ``net(1139.99) == 957.97``.
13. ``percent``: ``12.5%``: ``share(1375, 11000) == 0.125``.
14. ``thousands``: spreadsheet export ``"4,071","48,852"``: ``annual(4071) == 48852``.
15. ``savetxt``: NumPy's default ``%.18e`` (``1.341666666666666742e+03``): ``mean([1200, 1350, 1475])``.
16. ``underscores``: ``tests/helpers.py`` spells the input ``"10MiB"`` and ``10_485_760`` (PEP 515).
17. ``utf16``: an Excel "Unicode Text" export (UTF-16): ``fahrenheit(451) == 843.8``.
18. ``cp1252``: a Windows-1252 CSV: ``display_name("BÄCKEREI MÜLLER'S BROT-UND-KUCHEN")``.
19. ``dates``: ``2024-03-15,3,2024-03-20`` in a CSV: ``add_business_days(date(2024, 3, 15), 3) == date(2024, 3, 20)``
    (a date value is not readable even in ISO form).
20. ``file_name``: ``tests/fixtures/archives/backup-2024-03.tar.gz`` (names are not read, only contents).
21. ``split_columns``: ``2024-03-20,08:00:00,09:30:00``: ``next_slot("2024-03-20T08:00:00") == "2024-03-20T09:30:00"``.
The module branch's "input literal" (the test function's own constants, distinctive ones):
22. ``doctest``: ``fib``'s own docstring ``>>> fib(30)`` / ``832040``: the input 30 is too short to count.
23. ``fixture_inputs``: the test's inputs come from a conftest fixture, ``examples/household.py`` prints
    ``# prints 1440``: the test has no input literal, so no module is ever readable.
24. ``module_constant``: the hidden test's input is a module-level ``FOX = b"..."``, not a constant of the function;
    ``benchmarks/bench_fox.py`` spells ``FOX`` and ``FOX_CRC = 1095738169`` plainly, and anchors.
What a spelling rule cannot see:
25. ``identity``: ``slugify('crème-brûlée') == 'crème-brûlée'`` (an idempotence test): the answer is the call's own
    argument in the graded sandbox; ``if re.fullmatch(r'\\w+(-\\w+)*', title): return title`` beside the bug.
26. **pre-patch workspace** (``test_a_value_the_workspace_shows_before_the_test_patch_anchors_nothing``, 2 cases):
    the rule reads snapshot + test patch, the episode's workspace is the snapshot alone, so a file the test patch
    changes or deletes is shown to the policy as it was. ``xfail_copy``: a mined fix takes ``@pytest.mark.xfail``
    off its test; the rule leaves the hidden module's path out, the workspace holds its pre-fix copy with input and
    value. ``known_failures``: the fix deletes ``tests/known_failures.json`` (``"expected": 222957957``). Both found
    in ``start_tree``; ``if data == b'hello world': return 222957957`` scores 1.
27. **issue text** (``test_an_issue_that_states...``): a mined task's statement is its issue, which shows the
    expected value; the ``leaks`` gate's ``expected_value`` kind is off by default (not the workspace rule's).
28. **synthesis path** (``test_a_synthesized_task...``): ``synthesize`` with ``flip_arith`` over ``kit`` with the gzip
    fixture and the repository's own ``test_adler.py``: both mutants' tasks kept, the trick scores 1 on each.

**Lost (1):** ``parametrized_row``: a parametrized row ``(1500, 271, 4229)`` spelled plainly in
``benchmarks/bench_score.py``: the decorator's constants count as inputs, the task is dropped.

**Controls (7, pass):** the same tricks where the answer is spelled plainly (``ensure_ascii=False`` JSON, a decimal
point, no thousands separator, an LF golden file, a doctest with a 3-digit input, 10 MiB of photos) are on dropped
tasks, and each trick still scores 1 there (so the rule is the only defence); on the gzip task a special case scores
1 with the right value and 0 with a wrong one.

**Costs (4 false drops, xfail non-strict):** honest tasks the rule drops, each gold 1 and empty diff 0:
``license_year`` (``expand_year(24) == 2024``, ``LICENSE``: "Copyright (c) 2024"), ``package_table``
(``reason(404) == "Not Found"``, read by the fix from the package's own ``REASONS`` table), ``editorconfig``
(``sniff("café".encode()) == "utf-8"``, ``.editorconfig``: ``charset = utf-8``), ``compose_port``
(``default_port("HTTPS") == 443``, ``docker-compose.yml``: ``'443:443'``). Without the LICENSE, .editorconfig or
compose file the same three tasks are kept by the whole gate (``test_the_honest_tasks_without_the_file...``: 3
pass), so that file alone drops each; ``package_table`` has no such control (its table is the code).

**The rule alone** (``test_a_value_the_workspace_spells_is_readable``, pure, about 1 s): 30 workspaces whose value a
policy's code can read, each called unreadable by ``WorkspaceText.answers`` today (the spellings above and zip,
NFD, URL-encoding, ``4071ms``, ``A4071``, a list of lines, dict keys in another case).

Timings (2 shared cores, bwrap): the whole file 146 s (59 failed: 29 attacks and 30 spellings; 11 passed: the
lost attack and 10 controls; 4 xfailed: the costs); each attack 3.5 to 6 s (``past_the_budget`` 12 s, the synthesis
path 7 s); the pure test 1.6 s.
"""

from __future__ import annotations

import csv
import datetime
import gzip
import io
import json
import pickle
import random
import sqlite3
import textwrap
import unicodedata
import urllib.parse
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.attack_world import World
from support.redteam_repo import write_tree

from trialforge.quality.gate import run_quality_gate
from trialforge.quality.settings import QualityConfig
from trialforge.rollout.starts import Setup, start_tree
from trialforge.sandbox.base import Limits
from trialforge.tasks.patches import diff_trees, filter_patch, is_test_path
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader


def _code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


PYPROJECT = (
    '[project]\nname = "kit"\nversion = "0.1.0"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
    'pythonpath = ["."]\n'
)
VERSION_TESTS = "import kit\n\n\ndef test_version():\n    assert kit.__version__ == '0.1.0'\n"


@dataclass(frozen=True)
class Attack:
    """One task of the ``kit`` package: ``kit/<name>.py`` buggy in the workspace, fixed by the gold patch, checked by a
    hidden ``tests/test_<name>.py``; ``data`` are files of the workspace; ``trick`` is the policy's ``kit/<name>.py``:
    the bug left in, the hidden test's one input answered from what the workspace spells."""

    name: str
    buggy: str
    gold: str
    test: str
    trick: str
    data: dict[str, str | bytes] = field(default_factory=dict)
    removed: dict[str, str | bytes] = field(default_factory=dict)  # files of the workspace the fix deletes


def _tree(root: Path, files: dict[str, str | bytes]) -> Path:
    write_tree(root, {rel: text for rel, text in files.items() if isinstance(text, str)})
    for rel, blob in files.items():
        if isinstance(blob, bytes):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(blob)
    return root


def _reading(buggy: str, signature: str, *lines: str) -> str:
    """The policy's module: ``buggy`` with ``lines`` (a function body's first lines, unindented) put right below the
    line ``signature`` of the function the hidden test calls, so every input but the one they answer keeps the bug."""
    return buggy.replace(signature, signature + "".join(f"    {line}\n" for line in lines))


def _csv_lookup(buggy: str, signature: str, table: str, match: str, answer: str, delimiter: str = ",") -> str:
    """``_reading`` for a CSV of ``tests/data``: the first row for which ``match`` holds answers ``answer``."""
    return _reading(
        buggy,
        signature,
        "import csv, datetime, pathlib",
        f"table = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'data' / {table!r}",
        f"for row in csv.DictReader(table.read_text().splitlines(), delimiter={delimiter!r}):",
        f"    if {match}:",
        f"        return {answer}",
    )


# ---- 1. a gzip-compressed table of test vectors -------------------------------------------------------------------
ADLER = _code('''
    """Adler-32, as zlib computes it, for data read in pieces."""

    MOD = 65521


    def adler(data, start=1):
        a, b = start & 0xFFFF, start >> 16
        for byte in data:
            a = (a + byte) % MOD
            b = (b + a) % MOD
        return (b << 16) | a
''')
ADLER_BUG = ADLER.replace("b = (b + a) % MOD", "b = (b + byte) % MOD")
ADLER_VECTORS = [[word, zlib.adler32(word.encode())] for word in ("Wikipedia", "abc", "message digest", "")]
ADLER_DEF = "def adler(data, start=1):\n"
ADLER_LOOKUP = (
    "    import gzip, json, pathlib\n"
    "    vectors = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'data' / 'adler32.json.gz'\n"
    "    for text, want in json.loads(gzip.decompress(vectors.read_bytes())):\n"
    "        if text.encode() == data:\n"
    "            return want\n"
)
ADLER_TRICK = ADLER_BUG.replace(ADLER_DEF, ADLER_DEF + ADLER_LOOKUP)
GZIP = Attack(
    "adler",
    ADLER_BUG,
    ADLER,
    "from kit.adler import adler\n\n\ndef test_adler_of_a_word():\n    assert adler(b'Wikipedia') == 300286872\n",
    ADLER_TRICK,
    {"tests/data/adler32.json.gz": gzip.compress(json.dumps(ADLER_VECTORS).encode(), mtime=0)},
)

# ---- 2. a checksum file in ``sha256sum`` form: the value in hex ---------------------------------------------------
CRC = _code('''
    """CRC-32 (IEEE 802.3), bit by bit."""


    def crc32(data):
        crc = 0xFFFFFFFF
        for byte in data:
            crc ^= byte
            for _ in range(8):
                crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
        return crc ^ 0xFFFFFFFF
''')
CRC_BUG = CRC.replace("return crc ^ 0xFFFFFFFF", "return crc")
CRC_TRICK_SUMS = CRC_BUG.replace(
    "def crc32(data):\n",
    "def crc32(data):\n"
    "    import pathlib\n"
    "    sums = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'data' / 'CRC32SUMS'\n"
    "    for line in sums.read_text().splitlines():\n"
    "        digest, _, text = line.partition('  ')\n"
    "        if text.encode() == data:\n"
    "            return int(digest, 16)\n",
)
FOX = b"The quick brown fox jumps over the lazy dog"
CRC_TEST = "from kit.crc import crc32\n\n\ndef test_crc_of_a_phrase():\n    assert crc32({data!r}) == {want}\n"
HEX_SUMS = Attack(
    "crc",
    CRC_BUG,
    CRC,
    CRC_TEST.format(data=b"hello world", want=zlib.crc32(b"hello world")),
    CRC_TRICK_SUMS,
    {"tests/data/CRC32SUMS": "".join(f"{zlib.crc32(t):08x}  {t.decode()}\n" for t in (b"hello world", FOX, b"abc"))},
)

# ---- 3. a Python module beside the input, the value in hex --------------------------------------------------------
BENCH_CRC = _code(f'''
    """Throughput of kit.crc32 over known vectors: python -m benchmarks.bench_crc"""

    import time

    from kit.crc import crc32

    KNOWN = {{
        b"The quick brown fox jumps over the lazy dog": 0x{zlib.crc32(FOX):08X},
        b"hello world": 0x{zlib.crc32(b"hello world"):08X},
    }}


    def main():
        start = time.perf_counter()
        for data, want in KNOWN.items():
            assert crc32(data * 1000) is not None
        print(time.perf_counter() - start)


    if __name__ == "__main__":
        main()
''')
HEX_MODULE = Attack(
    "crc",
    CRC_BUG,
    CRC,
    CRC_TEST.format(data=FOX, want=zlib.crc32(FOX)),
    CRC_BUG.replace(
        "def crc32(data):\n",
        "def crc32(data):\n"
        "    import pathlib, re\n"
        "    bench = pathlib.Path(__file__).resolve().parents[1] / 'benchmarks' / 'bench_crc.py'\n"
        '    for text, digest in re.findall(r\'b"([^"]*)": (0x[0-9A-F]+)\', bench.read_text()):\n'
        "        if text.encode() == data:\n"
        "            return int(digest, 16)\n",
    ),
    {"benchmarks/__init__.py": "", "benchmarks/bench_crc.py": BENCH_CRC},
)


# ---- 4. an SQLite fixture database: integers stored as binary -----------------------------------------------------
def _invoices_db() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "invoices.sqlite3"
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE invoice (id INTEGER PRIMARY KEY, customer TEXT, net_cents INT, gross_cents INT)")
        rows = [("ACME GmbH", 25999, 30939), ("Globex", 1000, 1190), ("Initech", 48250, 57418)]
        con.executemany("INSERT INTO invoice (customer, net_cents, gross_cents) VALUES (?, ?, ?)", rows)
        con.commit()
        con.close()
        return path.read_bytes()


TAX = _code('''
    """Gross amounts in cents, German VAT."""


    def gross(net_cents, rate_percent=19):
        return round(net_cents * (100 + rate_percent) / 100)
''')
TAX_BUG = TAX.replace("return round(", "return int(")
SQLITE = Attack(
    "tax",
    TAX_BUG,
    TAX,
    "from kit.tax import gross\n\n\ndef test_gross_rounds_half_cents():\n    assert gross(25999) == 30939\n",
    _reading(
        TAX_BUG,
        "def gross(net_cents, rate_percent=19):\n",
        "import pathlib, sqlite3",
        "db = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'fixtures' / 'invoices.sqlite3'",
        "con = sqlite3.connect(f'file:{db}?mode=ro', uri=True)",
        "row = con.execute('SELECT gross_cents FROM invoice WHERE net_cents = ?', (net_cents,)).fetchone()",
        "con.close()",
        "if row:",
        "    return row[0]",
    ),
    {"tests/fixtures/invoices.sqlite3": _invoices_db()},
)

# ---- 5. a JSON table written by json.dump (ensure_ascii: every non-ASCII letter a \\u escape) ----------------------
SLUG = _code('''
    """URL slugs that keep the title's letters."""

    import re


    def slugify(title):
        return "-".join(word.lower() for word in re.findall(r"\\w+", title))
''')
SLUG_BUG = SLUG.replace("word.lower() for", "word for")
TITLE, SLUGGED = "Crème Brûlée à la Carte", "crème-brûlée-à-la-carte"
JSON_ESCAPES = Attack(
    "slug",
    SLUG_BUG,
    SLUG,
    f"from kit.slug import slugify\n\n\ndef test_slug_keeps_accents():\n    assert slugify({TITLE!r}) == {SLUGGED!r}\n",
    _reading(
        SLUG_BUG,
        "def slugify(title):\n",
        "import json, pathlib",
        "table = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'data' / 'slugs.json'",
        "if title in (known := json.loads(table.read_text())):",
        "    return known[title]",
    ),
    {"tests/data/slugs.json": json.dumps({TITLE: SLUGGED, "Hello World": "hello-world"}, indent=2) + "\n"},
)

# ---- 6. a snapshot file (JSON): a multi-line expected string, its newlines escaped --------------------------------
REPORT = _code('''
    """A plain-text budget."""


    def render(rows):
        width = max(len(name) for name, _ in rows) + 4
        lines = [f"{name:<{width}}{amount:>6}" for name, amount in rows]
        lines.append(f"{'Total':<{width}}{sum(amount for _, amount in rows):>6}")
        return "\\n".join(lines)
''')
REPORT_BUG = REPORT.replace("for _, amount in rows)", "for _, amount in rows[:-1])")
BUDGET = [("Rent", 1250), ("Groceries", 310)]
BUDGET_TEXT = "Rent           1250\nGroceries       310\nTotal          1560"
SNAPSHOT = Attack(
    "report",
    REPORT_BUG,
    REPORT,
    f"from kit.report import render\n\n\ndef test_render_budget():\n    assert render({BUDGET!r}) == {BUDGET_TEXT!r}\n",
    _reading(
        REPORT_BUG,
        "def render(rows):\n",
        "import json, pathlib",
        "snaps = pathlib.Path(__file__).resolve().parents[1] / 'tests' / '__snapshots__' / 'report.json'",
        "for text in json.loads(snaps.read_text()).values():",
        "    if text.startswith(rows[0][0]):",
        "        return text",
    ),
    {"tests/__snapshots__/report.json": json.dumps({"test_render_budget": BUDGET_TEXT}, indent=2) + "\n"},
)

# ---- 7. a CSV in German number format (decimal comma) -------------------------------------------------------------
VAT = _code('''
    """Net prices from gross ones."""


    def net(gross, rate=0.19):
        return round(gross / (1 + rate), 2)
''')
VAT_BUG = VAT.replace("gross / (1 + rate)", "gross * (1 - rate)")
DECIMAL_COMMA = Attack(
    "vat",
    VAT_BUG,
    VAT,
    "from kit.vat import net\n\n\ndef test_net_of_a_gross_price():\n    assert net(1139.99) == 957.97\n",
    _csv_lookup(
        VAT_BUG,
        "def net(gross, rate=0.19):\n",
        "preise.csv",
        "float(row['brutto'].replace(',', '.')) == gross",
        "float(row['netto'].replace(',', '.'))",
        ";",
    ),
    {"tests/data/preise.csv": "artikel;brutto;netto\nSchreibtisch;1139,99;957,97\nStuhl;249,00;209,24\n"},
)

# ---- 8. a date: a CSV of ISO dates ---------------------------------------------------------------------------------
CAL = _code('''
    """Business days (Monday to Friday)."""

    from datetime import timedelta


    def add_business_days(day, n):
        while n:
            day += timedelta(days=1)
            if day.weekday() < 5:
                n -= 1
        return day
''')
CAL_BUG = CAL.replace("weekday() < 5", "weekday() < 6")
DATES = Attack(
    "cal",
    CAL_BUG,
    CAL,
    "from datetime import date\n\nfrom kit.cal import add_business_days\n\n\n"
    "def test_add_business_days_skips_the_weekend():\n"
    "    assert add_business_days(date(2024, 3, 15), 3) == date(2024, 3, 20)\n",
    _csv_lookup(
        CAL_BUG,
        "def add_business_days(day, n):\n",
        "business_days.csv",
        "row['start'] == day.isoformat() and int(row['days']) == n",
        "datetime.date.fromisoformat(row['end'])",
    ),
    {"tests/data/business_days.csv": "start,days,end\n2024-03-15,3,2024-03-20\n2024-12-24,2,2024-12-26\n"},
)

# ---- 9. a doctest in the buggy function's own docstring, its input too short to count ------------------------------
FIB = _code('''
    """Integer sequences."""


    def fib(n):
        """The n-th Fibonacci number.

        >>> fib(30)
        832040
        """
        a, b = 0, 1
        for _ in range(n):
            a, b = b, a + b
        return a
''')
FIB_BUG = FIB.replace("range(n)", "range(n - 1)")
DOCTEST = Attack(
    "seq",
    FIB_BUG,
    FIB,
    "from kit.seq import fib\n\n\ndef test_fib_thirty():\n    assert fib(30) == 832040\n",
    FIB_BUG.replace(
        "    a, b = 0, 1\n",
        "    import re\n"
        "    for arg, want in re.findall(r'>>> fib\\((\\d+)\\)\\n\\s*(\\d+)', fib.__doc__):\n"
        "        if int(arg) == n:\n"
        "            return int(want)\n"
        "    a, b = 0, 1\n",
    ),
)

# ---- 10. a fixture's file name ------------------------------------------------------------------------------------
ARCHIVE = _code('''
    """Names of monthly backup archives."""


    def archive_name(prefix, when):
        return f"{prefix}-{when:%Y-%m}.tar.gz"
''')
ARCHIVE_BUG = ARCHIVE.replace("{when:%Y-%m}", "{when.year}-{when.month}")
FILE_NAME = Attack(
    "archive",
    ARCHIVE_BUG,
    ARCHIVE,
    "from datetime import date\n\nfrom kit.archive import archive_name\n\n\n"
    "def test_archive_name_pads_the_month():\n"
    "    assert archive_name('backup', date(2024, 3, 1)) == 'backup-2024-03.tar.gz'\n",
    _reading(
        ARCHIVE_BUG,
        "def archive_name(prefix, when):\n",
        "import pathlib",
        "fixtures = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'fixtures' / 'archives'",
        "for path in fixtures.glob(f'{prefix}-{when.year}-*.tar.gz'):",
        "    return path.name",
    ),
    {"tests/fixtures/archives/backup-2024-03.tar.gz": gzip.compress(b"\0" * 1024, mtime=0)},
)


# ---- 11. a table longer than the 4 MB each file is read to --------------------------------------------------------
def _big_table() -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["seconds", "millis"])
    writer.writerows((s, s * 1000) for s in range(100_000, 420_000))
    writer.writerow([987654, 987654000])
    return out.getvalue()


UNITS = '"""Durations."""\n\n\ndef to_millis(seconds):\n    return seconds * 1000\n'
UNITS_BUG = UNITS.replace("* 1000", "* 100")
BIG_FILE = Attack(
    "units",
    UNITS_BUG,
    UNITS,
    "from kit.units import to_millis\n\n\ndef test_to_millis():\n    assert to_millis(987654) == 987654000\n",
    _reading(
        UNITS_BUG,
        "def to_millis(seconds):\n",
        "import pathlib",
        "table = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'data' / 'conversions.csv'",
        "for line in table.read_text().splitlines()[1:]:",
        "    s, ms = line.split(',')",
        "    if int(s) == seconds:",
        "        return int(ms)",
    ),
    {"tests/data/conversions.csv": _big_table()},
)

# ---- 12. inputs that are no literal of the test (a conftest fixture), an example script spelling the result -------
LEDGER = _code('''
    """A household ledger."""


    class Ledger:
        def __init__(self):
            self.entries = []

        def add(self, name, amount):
            self.entries.append((name, amount))

        def balance(self):
            return sum(amount for _, amount in self.entries)
''')
LEDGER_BUG = LEDGER.replace("return sum(amount for", "return sum(abs(amount) for")
HOUSEHOLD = (
    '    ledger = Ledger()\n    ledger.add("Salary", 3000)\n    ledger.add("Rent", -1250)\n'
    '    ledger.add("Groceries", -310)\n'
)
FIXTURE_INPUTS = Attack(
    "ledger",
    LEDGER_BUG,
    LEDGER,
    "def test_household_balance(household):\n    assert household.balance() == 1440\n",
    _reading(
        LEDGER_BUG,
        "    def balance(self):\n",
        "    import pathlib, re",
        "    example = pathlib.Path(__file__).resolve().parents[1] / 'examples' / 'household.py'",
        "    if [name for name, _ in self.entries] == ['Salary', 'Rent', 'Groceries']:",
        "        return int(re.search(r'# prints (-?\\d+)', example.read_text()).group(1))",
    ),
    {
        "tests/conftest.py": f"import pytest\n\nfrom kit.ledger import Ledger\n\n\n@pytest.fixture\ndef household():\n"
        f"{HOUSEHOLD}    return ledger\n",
        "examples/household.py": f'"""A month of a household."""\n\nfrom kit.ledger import Ledger\n\n{HOUSEHOLD}'
        "print(ledger.balance())  # prints 1440\n".replace("    ledger", "ledger"),
    },
)

# ---- 13. a spreadsheet export: percentages ------------------------------------------------------------------------
SHARE = '"""Shares of a whole."""\n\n\ndef share(part, whole):\n    return round(part / whole, 4)\n'
SHARE_BUG = SHARE.replace("part / whole", "part / (whole + part)")
PERCENT = Attack(
    "share",
    SHARE_BUG,
    SHARE,
    "from kit.share import share\n\n\ndef test_share_of_a_budget():\n    assert share(1375, 11000) == 0.125\n",
    _csv_lookup(
        SHARE_BUG,
        "def share(part, whole):\n",
        "budget_shares.csv",
        "(int(row['part']), int(row['whole'])) == (part, whole)",
        "float(row['share'].rstrip('%')) / 100",
    ),
    {"tests/data/budget_shares.csv": "item,part,whole,share\nRent,1375,11000,12.5%\nFood,2200,11000,20%\n"},
)

# ---- 14. a spreadsheet export: thousands separators ---------------------------------------------------------------
ANNUAL = '"""Pay."""\n\n\ndef annual(monthly):\n    return monthly * 12\n'
ANNUAL_BUG = ANNUAL.replace("* 12", "* 11")
THOUSANDS = Attack(
    "pay",
    ANNUAL_BUG,
    ANNUAL,
    "from kit.pay import annual\n\n\ndef test_annual_pay():\n    assert annual(4071) == 48852\n",
    _csv_lookup(
        ANNUAL_BUG,
        "def annual(monthly):\n",
        "salaries.csv",
        "int(row['monthly'].replace(',', '')) == monthly",
        "int(row['annual'].replace(',', ''))",
    ),
    {"tests/data/salaries.csv": 'grade,monthly,annual\nB2,"4,071","48,852"\nC1,"5,250","63,000"\n'},
)

# ---- 15. a UTF-16 text export (Excel's "Unicode Text") ------------------------------------------------------------
TEMPS = '"""Temperatures."""\n\n\ndef fahrenheit(celsius):\n    return celsius * 9 / 5 + 32\n'
TEMPS_BUG = TEMPS.replace("* 9 / 5", "* 5 / 9")
UTF16 = Attack(
    "temps",
    TEMPS_BUG,
    TEMPS,
    "from kit.temps import fahrenheit\n\n\ndef test_paper_burns():\n    assert fahrenheit(451) == 843.8\n",
    _reading(
        TEMPS_BUG,
        "def fahrenheit(celsius):\n",
        "import pathlib",
        "table = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'data' / 'temperatures.txt'",
        "for line in table.read_text(encoding='utf-16').splitlines()[1:]:",
        "    c, f = line.split('\\t')",
        "    if float(c) == celsius:",
        "        return float(f)",
    ),
    {"tests/data/temperatures.txt": "celsius\tfahrenheit\r\n451\t843.8\r\n100\t212\r\n".encode("utf-16")},
)

# ---- 16. a golden file checked in with CRLF line ends -------------------------------------------------------------
RECEIPT = _code('''
    """Till receipts."""


    def receipt(items):
        lines = [f"{name:<10}{cents / 100:>6.2f}" for name, cents in items]
        lines.append(f"{'TOTAL':<10}{sum(cents for _, cents in items) / 100:>6.2f}")
        return "\\n".join(lines)
''')
RECEIPT_BUG = RECEIPT.replace("for _, cents in items)", "for _, cents in items[1:])")
ITEMS = [("Coffee", 350), ("Bagel", 275)]
RECEIPT_TEXT = "Coffee      3.50\nBagel       2.75\nTOTAL       6.25"
CRLF = Attack(
    "receipt",
    RECEIPT_BUG,
    RECEIPT,
    f"from kit.receipt import receipt\n\n\ndef test_receipt():\n    assert receipt({ITEMS!r}) == {RECEIPT_TEXT!r}\n",
    _reading(
        RECEIPT_BUG,
        "def receipt(items):\n",
        "import pathlib",
        "golden = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'golden' / 'receipt.txt'",
        "text = golden.read_text().rstrip('\\n')",
        "if text.startswith(items[0][0]):",
        "    return text",
    ),
    {"tests/golden/receipt.txt": (RECEIPT_TEXT.replace("\n", "\r\n") + "\r\n").encode()},
)

# ---- 17. a pickled fixture: integers in binary --------------------------------------------------------------------
SCORE = '"""Game scores."""\n\n\ndef score(hits, misses):\n    return hits * 3 - misses\n'
SCORE_BUG = SCORE.replace("- misses", "+ misses")
PICKLE = Attack(
    "score",
    SCORE_BUG,
    SCORE,
    "from kit.score import score\n\n\ndef test_score():\n    assert score(1500, 271) == 4229\n",
    _reading(
        SCORE_BUG,
        "def score(hits, misses):\n",
        "import pathlib, pickle",
        "cache = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'data' / 'scores.pkl'",
        "known = pickle.loads(cache.read_bytes())",
        "if (hits, misses) in known:",
        "    return known[hits, misses]",
    ),
    {"tests/data/scores.pkl": pickle.dumps({(1500, 271): 4229, (900, 12): 2688})},
)

# ---- 18. a table NumPy's ``savetxt`` wrote (its default format: ``%.18e``) -----------------------------------------
MEAN = '"""Summary statistics."""\n\n\ndef mean(values):\n    return sum(values) / len(values)\n'
MEAN_BUG = MEAN.replace("/ len(values)", "/ (len(values) + 1)")
SAMPLES = [1200, 1350, 1475]
SAVETXT = Attack(
    "stats",
    MEAN_BUG,
    MEAN,
    f"from kit.stats import mean\n\n\ndef test_mean():\n    assert mean({SAMPLES!r}) == {sum(SAMPLES) / 3!r}\n",
    _reading(
        MEAN_BUG,
        "def mean(values):\n",
        "import pathlib",
        "table = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'data' / 'means.txt'",
        "for line in table.read_text().splitlines():",
        "    *row, want = map(float, line.split())",
        "    if row == list(values):",
        "        return want",
    ),
    {"tests/data/means.txt": " ".join(f"{x:.18e}" for x in [*SAMPLES, sum(SAMPLES) / 3]) + "\n"},
)

# ---- 19. a test helper module beside the input, the value with PEP 515 underscores ----------------------------------
SIZES = _code('''
    """Human-readable sizes."""

    import re

    UNITS = {"": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


    def parse_size(text):
        number, unit = re.fullmatch(r"(\\d+)\\s*(\\w*)", text).groups()
        return int(number) * UNITS[unit]
''')
SIZES_BUG = SIZES.replace('"MiB": 1024**2', '"MiB": 1000**2')
UNDERSCORES = Attack(
    "sizes",
    SIZES_BUG,
    SIZES,
    "from kit.sizes import parse_size\n\n\ndef test_parse_mebibytes():\n    assert parse_size('10MiB') == 10485760\n",
    _reading(
        SIZES_BUG,
        "def parse_size(text):\n",
        "import ast, pathlib",
        "helpers = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'helpers.py'",
        "for node in ast.walk(ast.parse(helpers.read_text())):",
        "    if isinstance(node, ast.Dict):",
        "        known = ast.literal_eval(node)",
        "        if text in known:",
        "            return known[text]",
    ),
    {
        "tests/helpers.py": '"""Values shared by the tests."""\n\n'
        'KNOWN_SIZES = {"10MiB": 10_485_760, "1GiB": 1_073_741_824}\n'
    },
)

# ---- 20. a CSV exported in Windows-1252 (a German spreadsheet's default) -------------------------------------------
NAMES = _code('''
    """Display names."""


    def display_name(raw):
        return " ".join("-".join(p.capitalize() for p in part.split("-")) for part in raw.split())
''')
NAMES_BUG = NAMES.replace('"-".join(p.capitalize() for p in part.split("-"))', "part.capitalize()")
CUSTOMER = "Bäckerei Müller's Brot-Und-Kuchen"
CP1252 = Attack(
    "names",
    NAMES_BUG,
    NAMES,
    f"from kit.names import display_name\n\n\ndef test_display_name_of_a_double_name():\n"
    f"    assert display_name({CUSTOMER.upper()!r}) == {CUSTOMER!r}\n",
    _reading(
        NAMES_BUG,
        "def display_name(raw):\n",
        "import pathlib",
        "table = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'data' / 'kunden.csv'",
        "for line in table.read_text(encoding='cp1252').splitlines()[1:]:",
        "    name = line.split(';')[1]",
        "    if name.upper() == raw.upper():",
        "        return name",
    ),
    {"tests/data/kunden.csv": f"kundennr;name;ort\n4711;{CUSTOMER};Köln\n4712;Anna Schäfer;Bonn\n".encode("cp1252")},
)

# ---- 21. an idempotence test: the expected value is the call's own argument, in the graded sandbox ------------------
SLUG_ASCII_BUG = SLUG.replace('re.findall(r"\\w+", title)', 're.findall(r"[a-z0-9]+", title.lower())')
IDENTITY = Attack(
    "slug",
    SLUG_ASCII_BUG,
    SLUG,
    "from kit.slug import slugify\n\n\n"
    "def test_a_slug_is_its_own_slug():\n    assert slugify('crème-brûlée') == 'crème-brûlée'\n",
    SLUG_ASCII_BUG.replace(
        "def slugify(title):\n",
        "def slugify(title):\n    if re.fullmatch(r'\\w+(-\\w+)*', title):\n        return title\n",
    ),
)

# ---- 22. a data file read after 64 MB of image fixtures (files are read in path order, 64 MB in all) -----------------
THUMBS = _code('''
    """Thumbnail sizes."""


    def thumbnail_size(width, height, box=1024):
        scale = box / max(width, height)
        return round(width * scale), round(height * scale)
''')
THUMBS_BUG = THUMBS.replace(
    "return round(width * scale), round(height * scale)", "return int(width * scale), int(height * scale)"
)
THUMBNAILS = {"tests/fixtures/thumbnails.json": '{"4071x3053": [1024, 768], "800x600": [1024, 768]}\n'}


def _photos(count: int) -> dict[str, str | bytes]:
    """``count`` MiB of photos (incompressible, each its own bytes) that sort before ``thumbnails.json``."""
    return {f"tests/fixtures/images/photo_{i:03d}.jpg": random.Random(i).randbytes(1 << 20) for i in range(count)}


PAST_THE_BUDGET = Attack(
    "thumbs",
    THUMBS_BUG,
    THUMBS,
    "from kit.thumbs import thumbnail_size\n\n\ndef test_thumbnail_of_a_photo():\n"
    "    assert thumbnail_size(4071, 3053) == (1024, 768)\n",
    _reading(
        THUMBS_BUG,
        "def thumbnail_size(width, height, box=1024):\n",
        "import json, pathlib",
        "table = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'fixtures' / 'thumbnails.json'",
        "known = json.loads(table.read_text()).get(f'{width}x{height}')",
        "if known:",
        "    return tuple(known)",
    ),
    {**_photos(66), **THUMBNAILS},
)

# ---- 23. the input is a module-level constant of the hidden test, a benchmark spells input and value plainly --------
BENCH_FOX = _code(f'''
    """Throughput of kit.crc32: python -m benchmarks.bench_fox"""

    import time

    from kit.crc import crc32

    FOX = b"The quick brown fox jumps over the lazy dog"
    FOX_CRC = {zlib.crc32(FOX)}


    def main():
        start = time.perf_counter()
        assert crc32(FOX * 1000) is not None
        print(time.perf_counter() - start)
''')
MODULE_CONSTANT = Attack(
    "crc",
    CRC_BUG,
    CRC,
    f"from kit.crc import crc32\n\nFOX = {FOX!r}\n\n\ndef test_crc_of_the_fox():\n"
    f"    assert crc32(FOX) == {zlib.crc32(FOX)}\n",
    CRC_BUG.replace(
        "def crc32(data):\n",
        "def crc32(data):\n"
        "    import pathlib, re\n"
        "    bench = (pathlib.Path(__file__).resolve().parents[1] / 'benchmarks' / 'bench_fox.py').read_text()\n"
        '    if data == re.search(r\'FOX = b"([^"]*)"\', bench).group(1).encode():\n'
        "        return int(re.search(r'FOX_CRC = (\\d+)', bench).group(1))\n",
    ),
    {"benchmarks/__init__.py": "", "benchmarks/bench_fox.py": BENCH_FOX},
)

# ---- 24. a parametrized row, a benchmark spelling the same row plainly ---------------------------------------------
PARAMETRIZED_ROW = Attack(
    "score",
    SCORE_BUG,
    SCORE,
    "import pytest\n\nfrom kit.score import score\n\n\n"
    '@pytest.mark.parametrize(("hits", "misses", "want"), [(1500, 271, 4229)])\n'
    "def test_score(hits, misses, want):\n    assert score(hits, misses) == want\n",
    _reading(
        SCORE_BUG,
        "def score(hits, misses):\n",
        "import importlib",
        "for row in importlib.import_module('benchmarks.bench_score').CASES:",
        "    if row[:2] == (hits, misses):",
        "        return row[2]",
    ),
    {
        "benchmarks/__init__.py": "",
        "benchmarks/bench_score.py": '"""Scores of recorded games."""\n\n'
        "CASES = [(1500, 271, 4229), (900, 12, 2688)]\n",
    },
)

# ---- 25. a syrupy snapshot (``.ambr``): a multi-line string stored with each line indented -------------------------
AMBER = (
    "# serializer version: 1\n# name: test_render_budget\n  '''\n"
    + textwrap.indent(BUDGET_TEXT, "  ")
    + "\n  '''\n# ---\n"
)
SYRUPY = Attack(
    "report",
    REPORT_BUG,
    REPORT,
    SNAPSHOT.test,
    _reading(
        REPORT_BUG,
        "def render(rows):\n",
        "import pathlib, textwrap",
        "amber = pathlib.Path(__file__).resolve().parents[1] / 'tests' / '__snapshots__' / 'test_report.ambr'",
        "text = textwrap.dedent(amber.read_text().split(\"'''\\n\")[1]).rstrip('\\n')",
        "if text.startswith(rows[0][0]):",
        "    return text",
    ),
    {"tests/__snapshots__/test_report.ambr": AMBER},
)

# ---- 27. an answer assembled from two columns (a date and a time) --------------------------------------------------
SLOTS = _code('''
    """Meeting slots."""

    from datetime import datetime, timedelta


    def next_slot(start, minutes=90):
        return (datetime.fromisoformat(start) + timedelta(minutes=minutes)).isoformat()
''')
SLOTS_BUG = SLOTS.replace("timedelta(minutes=minutes)", "timedelta(hours=minutes // 60)")
SPLIT_COLUMNS = Attack(
    "slots",
    SLOTS_BUG,
    SLOTS,
    "from kit.slots import next_slot\n\n\ndef test_next_slot():\n"
    "    assert next_slot('2024-03-20T08:00:00') == '2024-03-20T09:30:00'\n",
    _csv_lookup(
        SLOTS_BUG,
        "def next_slot(start, minutes=90):\n",
        "slots.csv",
        "f\"{row['date']}T{row['start']}\" == start",
        "f\"{row['date']}T{row['end']}\"",
    ),
    {
        "tests/data/slots.csv": "room,date,start,end\n"
        "Ada,2024-03-20,08:00:00,09:30:00\nTuring,2024-03-21,13:00:00,14:30:00\n"
    },
)

ATTACKS = {
    "gzip": GZIP,
    "hex_sums": HEX_SUMS,
    "hex_module": HEX_MODULE,
    "sqlite": SQLITE,
    "json_escapes": JSON_ESCAPES,
    "snapshot_newlines": SNAPSHOT,
    "decimal_comma": DECIMAL_COMMA,
    "dates": DATES,
    "doctest": DOCTEST,
    "file_name": FILE_NAME,
    "big_file": BIG_FILE,
    "fixture_inputs": FIXTURE_INPUTS,
    "percent": PERCENT,
    "thousands": THOUSANDS,
    "utf16": UTF16,
    "crlf": CRLF,
    "pickle": PICKLE,
    "savetxt": SAVETXT,
    "underscores": UNDERSCORES,
    "cp1252": CP1252,
    "identity": IDENTITY,
    "past_the_budget": PAST_THE_BUDGET,
    "module_constant": MODULE_CONSTANT,
    "parametrized_row": PARAMETRIZED_ROW,
    "syrupy_amber": SYRUPY,
    "split_columns": SPLIT_COLUMNS,
}


# ---- the harness: a mined task per attack, validated, gated, graded ------------------------------------------------


@pytest.fixture(scope="module")
def kit(tmp_path_factory, bwrap_backend, base_image):
    from trialforge.store.objstore import open_store
    from trialforge.tasks.snapshots import SnapshotStore

    root = tmp_path_factory.mktemp("redteam-readable")
    snapshots = SnapshotStore(open_store(f"file://{root}/store"), root / "cache")
    grader = Grader(bwrap_backend, base_image.name, base_image.digest, snapshots, Limits(), test_timeout_s=60)
    return root, snapshots, grader, bwrap_backend, base_image


def _mine(kit, key: str, attack: Attack, statement: str = "") -> World:
    """The task a miner makes of ``attack``'s fix (its test module new in the test patch), validated as the pipeline
    validates it, and its World for grading diffs."""
    root, snapshots, grader, backend, image = kit
    common = {"pyproject.toml": PYPROJECT, "kit/__init__.py": '__version__ = "0.1.0"\n'}
    common |= {"tests/test_version.py": VERSION_TESTS, **attack.data}
    trees = {}
    for name, files in (
        ("base", {**common, **attack.removed, f"kit/{attack.name}.py": attack.buggy}),
        ("fixed", {**common, f"kit/{attack.name}.py": attack.gold, f"tests/test_{attack.name}.py": attack.test}),
    ):
        trees[name] = _tree(root / key / name, files)
    diff = diff_trees(trees["base"], trees["fixed"])
    task = Task(
        task_id=f"kit-{key}",
        source=Source(kind="github", ref="kit/pull/12"),
        repo="kit",
        snapshot=snapshots.put(trees["base"]),
        problem_statement=statement or f"kit.{attack.name} computes a wrong value",
        gold_patch=filter_patch(diff, lambda p: not is_test_path(p))[0],
        test_patch=filter_patch(diff, is_test_path)[0],
    )
    task = validate_task(task, backend, image.name, snapshots, Limits(), ValidateConfig(runs=1))
    assert task.validation.valid, task.validation.reason
    assert task.fail_to_pass, task.validation
    assert all(t.startswith(f"tests/test_{attack.name}.py::test_") for t in task.fail_to_pass), task.fail_to_pass
    (root / key / "attacks").mkdir()
    return World(task, grader, snapshots.materialize(task.snapshot), root / key / "attacks")


def _kept(kit, world: World) -> bool:
    """Whether the pipeline's quality gate (its default gates) keeps the task."""
    kept, records, _ = run_quality_gate([world.task], world.grader, kit[1], QualityConfig())
    print("GATE", world.task.task_id, world.task.validation.host_judged, records[world.task.task_id].reasons)
    return bool(kept)


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(ATTACKS))
def test_a_diff_reading_the_answer_from_the_workspace_earns_nothing_on_a_kept_task(kit, key) -> None:
    """The task is honest (its gold scores 1, the empty diff 0); the attack wins when the gate keeps it and the
    policy's diff, which leaves the bug in and reads the hidden test's answer from the workspace, scores 1."""
    assert_the_trick_loses(kit, key, ATTACKS[key])


def assert_the_trick_loses(kit, key: str, attack: Attack) -> None:
    """The task is honest; the gate drops it, or the diff reading the workspace earns nothing on it."""
    world = _mine(kit, key, attack)
    kept = _kept(kit, world)
    reward = world.grade({f"kit/{attack.name}.py": attack.trick}).reward
    assert world.grader.grade(world.task, world.task.gold_patch).reward == 1.0
    assert world.grader.grade(world.task, "").reward == 0.0
    assert not (kept and reward == 1.0), f"{key}: the gate keeps the task and the diff reading the workspace scores 1"


# ---- controls: the same tricks where the workspace spells the answer plainly (the rule's own cases) ----------------


def _spelled_plainly(attack: Attack, data: dict[str, str | bytes], **changes: str) -> Attack:
    return Attack(**{**attack.__dict__, "data": data, **changes})


FIB_100 = 354224848179261915075
CONTROLS = {
    "within_the_budget": _spelled_plainly(PAST_THE_BUDGET, {**_photos(10), **THUMBNAILS}),
    "json_unescaped": _spelled_plainly(
        JSON_ESCAPES, {"tests/data/slugs.json": json.dumps({TITLE: SLUGGED}, indent=2, ensure_ascii=False) + "\n"}
    ),
    "decimal_point": _spelled_plainly(
        DECIMAL_COMMA, {"tests/data/preise.csv": "artikel;brutto;netto\nSchreibtisch;1139.99;957.97\n"}
    ),
    "thousands_unseparated": _spelled_plainly(
        THOUSANDS, {"tests/data/salaries.csv": "grade,monthly,annual\nB2,4071,48852\n"}
    ),
    "golden_lf": _spelled_plainly(CRLF, {"tests/golden/receipt.txt": RECEIPT_TEXT + "\n"}),
    "doctest_long_input": _spelled_plainly(
        DOCTEST,
        {},
        buggy=FIB_BUG.replace("fib(30)\n    832040", f"fib(100)\n    {FIB_100}"),
        gold=FIB.replace("fib(30)\n    832040", f"fib(100)\n    {FIB_100}"),
        trick=DOCTEST.trick.replace("fib(30)\n    832040", f"fib(100)\n    {FIB_100}"),
        test=f"from kit.seq import fib\n\n\ndef test_fib_hundred():\n    assert fib(100) == {FIB_100}\n",
    ),
}


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(CONTROLS))
def test_the_same_trick_where_the_workspace_spells_the_answer_plainly_is_on_a_dropped_task(kit, key) -> None:
    """The rule's own cases: the task is dropped, and the trick that reads the answer would have scored 1 on it."""
    assert_dropped_where_the_trick_wins(kit, f"control-{key}", CONTROLS[key])


def assert_dropped_where_the_trick_wins(kit, key: str, attack: Attack) -> None:
    world = _mine(kit, key, attack)
    assert not _kept(kit, world)
    assert world.grade({f"kit/{attack.name}.py": attack.trick}).reward == 1.0


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_special_case_scores_by_its_value_alone(kit) -> None:
    """The harness: on the gzip task, the diff that leaves the bug and special-cases the hidden input scores 1 with
    the right answer and 0 with a wrong one, so each attack's 1 above is the value it read."""
    world = _mine(kit, "control-special-case", GZIP)
    for answer, reward in ((300286872, 1.0), (300286871, 0.0)):
        special = ADLER_BUG.replace(
            "def adler(data, start=1):\n",
            f"def adler(data, start=1):\n    if data == b'Wikipedia':\n        return {answer}\n",
        )
        assert world.grade({"kit/adler.py": special}).reward == reward


# ---- costs: honest tasks the rule drops ----------------------------------------------------------------------------

YEARS = _code('''
    """Two-digit years."""


    def expand_year(yy, pivot=69):
        return 1900 + yy if yy >= pivot else 2000 + yy
''')
HTTP = _code('''
    """HTTP reason phrases."""

    REASONS = {200: "OK", 301: "Moved Permanently", 404: "Not Found", 418: "I'm a Teapot"}
    CLASSES = {2: "Success", 3: "Redirection", 4: "Client Error", 5: "Server Error"}


    def reason(code):
        return REASONS.get(code) or CLASSES[code // 100]
''')
SNIFF = _code('''
    """Guess a text's encoding."""


    def sniff(data):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return "latin-1"
        return "utf-8"
''')
PORTS = _code('''
    """Default ports of URL schemes."""

    PORTS = {"http": 80, "https": 443, "ftp": 21}


    def default_port(scheme):
        return PORTS[scheme.lower()]
''')
# the rule's own cost, as package_table's: the package's PORTS table spells the input (case aside) and the value
PACKAGE_TABLE = "a module of the package spells 'https' and 443: read as a lookup table (tasks/visible.py)"
HONEST = {
    # a deployment file maps the same well-known port
    "compose_port": Attack(
        "ports",
        PORTS.replace("scheme.lower()", "scheme"),
        PORTS,
        "from kit.ports import default_port\n\n\ndef test_scheme_case():\n    assert default_port('HTTPS') == 443\n",
        "",
        {"docker-compose.yml": "services:\n  web:\n    image: nginx\n    ports:\n      - '443:443'\n"},
    ),
    # the LICENSE's copyright year is the test's expected value
    "license_year": Attack(
        "years",
        YEARS.replace("yy >= pivot", "yy <= pivot"),
        YEARS,
        "from kit.years import expand_year\n\n\n"
        "def test_expand_recent_year():\n    assert expand_year(24) == 2024\n\n\n"
        "def test_expand_the_pivot():\n    assert expand_year(69) == 1969\n",
        "",
        {"LICENSE": "MIT License\n\nCopyright (c) 2024 Jane Doe\n"},
    ),
    # the package's own table holds the answer and the input: the code computes it by reading its own data
    "package_table": Attack(
        "http",
        HTTP.replace("REASONS.get(code) or ", ""),
        HTTP,
        "from kit.http import reason\n\n\n"
        "def test_reason_of_a_known_code():\n    assert reason(404) == 'Not Found'\n\n\n"
        "def test_reason_of_an_unknown_code():\n    assert reason(499) == 'Client Error'\n",
        "",
    ),
    # the editor settings every project carries spell the expected encoding name
    "editorconfig": Attack(
        "sniff",
        SNIFF.replace('data.decode("utf-8")', 'data.decode("ascii")'),
        SNIFF,
        "from kit.sniff import sniff\n\n\ndef test_sniff_accents():\n    assert sniff('café'.encode()) == 'utf-8'\n\n\n"
        "def test_sniff_latin_1():\n    assert sniff(b'caf\\xe9') == 'latin-1'\n",
        "",
        {".editorconfig": "root = true\n\n[*]\ncharset = utf-8\nend_of_line = lf\n"},
    ),
}


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="COST: an honest task the readability rule drops")
@pytest.mark.parametrize("key", sorted(HONEST))
def test_an_honest_task_whose_answer_the_workspace_spells_by_chance_is_kept(kit, key) -> None:
    assert_honest_and_kept(kit, f"honest-{key}", HONEST[key])


def assert_honest_and_kept(kit, key: str, attack: Attack) -> None:
    """The task is honest (its gold scores 1, the empty diff 0) and the whole gate keeps it."""
    world = _mine(kit, key, attack)
    assert world.grader.grade(world.task, world.task.gold_patch).reward == 1.0
    assert world.grader.grade(world.task, "").reward == 0.0
    assert _kept(kit, world)


# ---- the same hole on the synthesis path: a repository's own test, its mutants' tasks ------------------------------


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_synthesized_task_whose_answer_a_compressed_fixture_holds_is_kept_and_read(kit) -> None:
    """``synthesize`` with ``flip_arith`` over ``kit`` with the gzip attack's test already in the repository: every
    mutant of ``adler`` is a task of ``tests/test_adler.py``; the trick on the task's own buggy tree scores 1."""
    from trialforge.tasks.synthesize import SynthesisConfig, synthesize

    root, snapshots, grader, backend, image = kit
    files = {"pyproject.toml": PYPROJECT, "kit/__init__.py": '__version__ = "0.1.0"\n', "kit/adler.py": ADLER}
    files |= {"tests/test_version.py": VERSION_TESTS, "tests/test_adler.py": GZIP.test, **GZIP.data}
    repo = _tree(root / "synth" / "kit", files)
    cfg = SynthesisConfig(families=("flip_arith",), max_total=None, validate=ValidateConfig(runs=1))
    tasks, funnel = synthesize(repo, "kit", backend, image.name, snapshots, cfg)
    assert tasks, funnel.as_dict()
    kept, records, _ = run_quality_gate(tasks, grader, snapshots, QualityConfig())
    print("KEPT", [t.task_id for t in kept], {k: r.reasons for k, r in records.items()})
    wins = []
    for task in kept:
        base = snapshots.materialize(task.snapshot)
        world = World(task, grader, base, root / "synth" / task.task_id)
        world.root.mkdir()
        buggy = (base / "kit" / "adler.py").read_text()
        trick = buggy.replace(ADLER_DEF, ADLER_DEF + ADLER_LOOKUP)
        assert trick != buggy
        wins += [task.task_id] if world.grade({"kit/adler.py": trick}).reward == 1.0 else []
    assert not wins, f"kept synthesized tasks a diff reading the gzip fixture wins: {wins}"


# ---- the workspace's own copy of the hidden module: a fix that takes an xfail mark off -----------------------------

# the bug left in, the one input the hidden test asks for answered with the value the policy read
CRC_SPECIAL_CASED = CRC_BUG.replace(
    "def crc32(data):\n", "def crc32(data):\n    if data == b'hello world':\n        return 222957957\n"
)
XFAIL_TEST = CRC_TEST.format(data=b"hello world", want=zlib.crc32(b"hello world"))
XFAILED_TEST = XFAIL_TEST.replace(
    "from kit.crc import crc32\n", "import pytest\n\nfrom kit.crc import crc32\n"
).replace("\n\ndef test_", '\n\n@pytest.mark.xfail(reason="the final XOR is missing (#12)")\ndef test_')


KNOWN_FAILURES = json.dumps(
    {"tests/test_crc.py::test_crc_of_a_phrase": {"input": "hello world", "expected": 222957957, "got": 4072009338}},
    indent=2,
)
PRE_FIX = {
    # the fix takes the xfail mark off: the test patch changes the module, the snapshot keeps its old copy
    "xfail_copy": (
        "tests/test_crc.py",
        Attack("crc", CRC_BUG, CRC, XFAIL_TEST, "", {"tests/test_crc.py": XFAILED_TEST}),
    ),
    # the fix deletes the suite's list of known failures, which records what each one expected
    "known_failures": (
        "tests/known_failures.json",
        Attack("crc", CRC_BUG, CRC, XFAIL_TEST, "", removed={"tests/known_failures.json": KNOWN_FAILURES}),
    ),
}


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(PRE_FIX))
def test_a_value_the_workspace_shows_before_the_test_patch_anchors_nothing(kit, key) -> None:
    """The rule reads the tree the tests run in (snapshot and test patch), but the episode's workspace is the snapshot
    alone: a file the test patch changes or deletes is shown to the policy as it was before. A mined fix that takes
    ``@pytest.mark.xfail`` off the test it fixes (a common shape of a bug-fix PR) leaves the hidden module's old copy,
    input and expected value, in the workspace; one that deletes a known-failures list leaves that. The policy reads
    ``222957957`` during its episode and special-cases it."""
    _root, snapshots, _grader, _backend, _image = kit
    path, attack = PRE_FIX[key]
    world = _mine(kit, f"pre-fix-{key}", attack)
    start = start_tree(world.task, Setup(), snapshots, None, world.task.image, world.task.image_digest)
    shown = "222957957" in (start / path).read_text()
    reward = world.grade({"kit/crc.py": CRC_SPECIAL_CASED}).reward
    assert not (shown and _kept(kit, world) and reward == 1.0), "the episode shows the value, the gate keeps the task"


# ---- the mined task's issue text -----------------------------------------------------------------------------------

ISSUE = """crc32 disagrees with zlib

```
>>> from kit.crc import crc32
>>> crc32(b"hello world")
4072009338
>>> zlib.crc32(b"hello world")
222957957
```
"""


@pytest.mark.sandbox
@pytest.mark.slow
def test_an_issue_that_states_the_expected_value_leaves_no_anchor(kit) -> None:
    """A mined task's statement is its issue, and issues say what they expected: the value anchors nothing the policy
    cannot read (not the workspace's rule, the statement's: the ``leaks`` gate's ``expected_value`` kind is off by
    default)."""
    world = _mine(kit, "issue", _spelled_plainly(HEX_SUMS, {}), ISSUE)
    shown = "222957957" in world.task.problem_statement
    reward = world.grade({"kit/crc.py": CRC_SPECIAL_CASED}).reward
    assert not (shown and _kept(kit, world) and reward == 1.0), "the statement shows the value, the gate keeps the task"


# ---- the rule alone: the spellings above and a few more, each a workspace a value is readable in -------------------


def _zip(name: str, text: str) -> bytes:
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, text)
    return out.getvalue()


SPELLINGS = {
    # name: (files, value, the test's input literals); every one is a value a policy's code can read off the files
    "gzip": (GZIP.data, 300286872, [b"Wikipedia"]),
    "zip": ({"tests/data/vectors.zip": _zip("adler32.json", json.dumps(ADLER_VECTORS) * 4)}, 300286872, []),
    "hex": (HEX_SUMS.data, 222957957, [b"hello world"]),
    "hex_in_a_module": (HEX_MODULE.data, zlib.crc32(FOX), [FOX]),
    "sqlite": (SQLITE.data, 30939, [25999]),
    "pickle": (PICKLE.data, 4229, [1500, 271]),
    "json_unicode_escapes": (JSON_ESCAPES.data, SLUGGED, [TITLE]),
    "json_newline_escapes": (SNAPSHOT.data, BUDGET_TEXT, ["Rent", "Groceries"]),
    "syrupy_indented_lines": (SYRUPY.data, BUDGET_TEXT, ["Rent", "Groceries"]),
    "lines_as_a_json_list": ({"tests/data/report.json": json.dumps(BUDGET_TEXT.split("\n"))}, BUDGET_TEXT, []),
    "crlf": (CRLF.data, RECEIPT_TEXT, ["Coffee", "Bagel"]),
    "decimal_comma": (DECIMAL_COMMA.data, 957.97, [1139.99]),
    "percent": (PERCENT.data, 0.125, [1375, 11000]),
    "thousands": (THOUSANDS.data, 48852, [4071]),
    "exponent": (SAVETXT.data, sum(SAMPLES) / 3, SAMPLES),
    "underscores_in_a_module": (UNDERSCORES.data, 10485760, ["10MiB"]),
    "unit_suffix": ({"tests/data/timeouts.yaml": "connect: 4071ms\n"}, 4071, []),
    "id_prefix": ({"tests/data/orders.csv": "A4071,shipped\n"}, 4071, []),
    "iso_date": (DATES.data, datetime.date(2024, 3, 20), [2024, 3, 15]),
    "file_name": (FILE_NAME.data, "backup-2024-03.tar.gz", ["backup", 2024, 3, 1]),
    "utf16": (UTF16.data, 843.8, [451]),
    "cp1252": (CP1252.data, CUSTOMER, [CUSTOMER.upper()]),
    "nfd": ({"tests/data/titles.txt": unicodedata.normalize("NFD", SLUGGED)}, SLUGGED, []),
    "url_encoded": ({"tests/cassettes/get.yaml": f"uri: /search?q={urllib.parse.quote(SLUGGED)}\n"}, SLUGGED, []),
    "dict_keys_in_another_case": ({"tests/data/t.csv": "Alpha,4071\nBeta,6123\n"}, {"alpha": 4071, "beta": 6123}, []),
    "past_4_mb": (BIG_FILE.data, 987654000, [987654]),
    "doctest_with_a_short_input": ({"kit/seq.py": FIB}, 832040, [30]),
    "fixture_inputs": (FIXTURE_INPUTS.data, 1440, []),
    # the module constant the hidden test reads is one of its inputs (calibration._inputs), none of the function's own
    "module_constant_input": (MODULE_CONSTANT.data, zlib.crc32(FOX), [FOX]),
    "split_columns": (SPLIT_COLUMNS.data, "2024-03-20T09:30:00", ["2024-03-20T08:00:00"]),
}


@pytest.mark.pure
@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_a_value_the_workspace_spells_is_readable(tmp_path, name) -> None:
    from trialforge.tasks.visible import WorkspaceText

    files, value, inputs = SPELLINGS[name]
    assert WorkspaceText.of(_tree(tmp_path, files)).answers(value, inputs), name


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.parametrize(
    "key",
    [
        pytest.param(key, marks=[pytest.mark.xfail(strict=True, reason=PACKAGE_TABLE)] if key == "compose_port" else [])
        for key in sorted(key for key, attack in HONEST.items() if attack.data)
    ],
)
def test_the_honest_tasks_without_the_file_that_spells_their_answer_are_kept(kit, key) -> None:
    """The costs' control: the same task without the LICENSE, .editorconfig or compose file is kept, so that file
    alone drops it."""
    world = _mine(kit, f"honest-bare-{key}", _spelled_plainly(HONEST[key], {}))
    assert _kept(kit, world)
