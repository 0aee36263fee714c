"""README.md and docs/ as a map that holds: every relative link resolves (to the heading, when it names one), every
code path and ``trialforge.`` module they name exists, and every page of docs/ is reachable from the README.

Pure: reads the pages and the source tree, imports nothing of trialforge. What counts as a claimed path:

- a relative markdown link ``[text](target#heading)``;
- a ``docs/NAME.md`` anywhere in a page's text;
- in a code span: ``src/...`` and ``trialforge/...``; ``PKG/...py`` or ``PKG/`` for a package of trialforge
  (``loop/iteration.py``, ``sandbox/``); ``benchmarks/``, ``flows/``, ``examples/``, ``scripts/`` files; and a
  dotted ``trialforge.MODULE[.NAME]`` whose first part is a module of trialforge (``trialforge.run_id``, an
  MLflow tag, is not). Placeholders (``flows/NAME.py``), globs and ellipses are not claims.

Test files in code spans are not checked: the pages also name test files of the repositories they ingest
(``tests/test_core.py``). Name one of ours as a link to have it checked.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[(?:[^\]`]|`[^`]*`)*\]\(([^)\s]+)\)")
DOC = re.compile(r"(?<![\w/.-])docs/[\w-]+\.md\b")
SPAN = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)
ROOT_DIRS = ("benchmarks", "flows", "examples", "scripts")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")  # NAME, RUN, HEX: a path's segment written as a placeholder


def _packages() -> frozenset[str]:
    return frozenset(p.name for p in (SRC / "trialforge").iterdir() if (p / "__init__.py").is_file())


def _modules() -> frozenset[str]:
    return _packages() | {p.stem for p in (SRC / "trialforge").glob("*.py")}


def slugs(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens, a repeat
    numbered (``-1``, ``-2``...)."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", text)):
        base = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(page: Path, text: str) -> list[str]:
    """Each relative link of ``text`` (the page at ``page``) whose file, or heading, does not exist."""
    broken = []
    prose = FENCE.sub("", text)
    for target in LINK.findall(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in slugs(resolved.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    for mention in DOC.findall(prose):
        if not (ROOT / mention).is_file():
            broken.append(f"{mention}: no such page")
    return broken


def _claimed_path(token: str) -> Path | None:
    """The file or directory ``token`` (a code span's word) claims exists, or None when it claims none."""
    token = token.split("::")[0].rstrip(",.;:)")
    if any(c in token for c in "*{}<>|…") or "..." in token or "/" not in token:
        return None
    parts = token.rstrip("/").split("/")
    if any(PLACEHOLDER.match(Path(p).stem) for p in parts):
        return None
    if parts[0] == "src":
        return ROOT / token
    if parts[0] in ("trialforge", "trialforge_env"):
        return SRC / token
    if parts[0] in _packages() and (token.endswith((".py", "/")) or len(parts) == 1):
        return SRC / "trialforge" / token
    if parts[0] in ROOT_DIRS and token.endswith((".py", ".sh")):
        return ROOT / token
    return None


def _bound(node: ast.stmt) -> list[str]:
    """The names a module-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [alias.asname or alias.name.split(".")[0] for alias in node.names]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _defines(module: Path, name: str) -> bool:
    """Whether ``module`` (a file, or a package's directory) binds ``name`` at its top level."""
    if module.is_dir():
        if (module / f"{name}.py").is_file() or (module / name / "__init__.py").is_file():
            return True
        module = module / "__init__.py"
    return any(name in _bound(node) for node in ast.parse(module.read_text()).body)


def _missing_module(dotted: str) -> str | None:
    """Why ``trialforge.A.B...`` names nothing, or None when it names a module (and, after it, one of its
    top-level names); also None when ``A`` is no module of trialforge (then it is not a module path)."""
    parts = dotted.rstrip("()").split(".")[1:]
    if not parts or parts[0] not in _modules():
        return None
    here = SRC / "trialforge"
    for i, part in enumerate(parts):
        if (here / part / "__init__.py").is_file():
            here = here / part
        elif here.is_dir() and (here / f"{part}.py").is_file():
            here = here / f"{part}.py"
        else:  # only the first name after the module is checked: Class.method is the class's business
            return None if _defines(here, part) else f"{'.'.join(['trialforge', *parts[: i + 1]])} does not exist"
    return None


def missing_paths(text: str) -> list[str]:
    """The code paths and trialforge modules ``text`` names in code spans that do not exist."""
    missing = []
    for span in SPAN.findall(FENCE.sub("", text)):
        for token in span.split():
            path = _claimed_path(token)
            if path is not None and not path.exists():
                missing.append(f"{token}: no such file or directory")
            if re.fullmatch(r"trialforge(\.\w+)+(\(\))?", token) and (why := _missing_module(token)):
                missing.append(why)
    return missing


def test_every_relative_link_and_page_mention_resolves():
    broken = {page.name: b for page in PAGES if (b := broken_links(page, page.read_text()))}
    assert not broken, broken


def test_every_code_path_and_module_a_page_names_exists():
    missing = {page.name: m for page in PAGES if (m := missing_paths(page.read_text()))}
    assert not missing, missing


def test_every_docs_page_is_reachable_from_the_readme_by_links():
    reached, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            linked = (page.parent / target.partition("#")[0]).resolve()
            if linked.suffix == ".md" and linked.is_file() and linked not in reached:
                reached.add(linked)
                todo.append(linked)
    unreached = [p.name for p in PAGES if p.resolve() not in reached and p != README]
    assert not unreached, f"pages no link from README.md leads to: {unreached}"


def test_the_checks_catch_a_broken_link_a_missing_heading_and_a_module_that_does_not_exist(tmp_path):
    page = tmp_path / "page.md"
    text = (
        "# Title\n\nSee [gone](nowhere.md), [here](#title), [there](#nope) and `docs/absent.md`.\n"
        "The loop is in `src/trialforge/loop/iteration.py`, not `src/trialforge/loop/gone.py` nor\n"
        "`loop/gone.py`; `trialforge.loop.iteration.run_iterations` exists, `trialforge.loop.iteration.nope`\n"
        "and `trialforge.loop.nope` do not; `flows/NAME.py` and `trialforge.run_id` claim nothing.\n"
        "```\n[in a fence](not-checked.md) `src/not/checked.py`\n```\n"
    )
    page.write_text(text)
    assert broken_links(page, text) == [
        "nowhere.md: no such file",
        "#nope: no heading #nope in page.md",
        "docs/absent.md: no such page",
    ]
    assert missing_paths(text) == [
        "src/trialforge/loop/gone.py: no such file or directory",
        "loop/gone.py: no such file or directory",
        "trialforge.loop.iteration.nope does not exist",
        "trialforge.loop.nope does not exist",
    ]
