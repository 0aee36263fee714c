"""Ingest adapters: SWE-bench JSON lines, GitHub REST exports, Jira CSV, git history mining.

Real git repositories are built in a temporary directory (a tiny package with tests, a bug and its
fix, Jira keys in commit messages, a merge, a binary file, a latin-1 file, a huge commit, and a
second repository with symlinks pointing outside). The exports under ``fixtures/ingest`` are in the
formats the real tools write; their commit shas are ``{{sha:NAME}}`` placeholders filled in here,
because the shas depend on the repositories built at test time.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from support.history import git_env

from trialforge.errors import PatchError, RepoError, TaskError
from trialforge.funnel import IngestFunnel
from trialforge.store.objstore import open_store
from trialforge.tasks.ingest.caps import MAX_PATCH_BYTES_SETTING, IngestCaps
from trialforge.tasks.ingest.extras import split_extras
from trialforge.tasks.ingest.git import Mirrors
from trialforge.tasks.ingest.github_rest import closing_refs, ingest_github_rest
from trialforge.tasks.ingest.gitlog import GITLOG_CONFIDENCE, ingest_git_history
from trialforge.tasks.ingest.jira import ingest_jira, link_confidence, parse_jira_date
from trialforge.tasks.ingest.records import read_json_records
from trialforge.tasks.ingest.swebench import env_commit, ingest_swebench, task_from_swebench, task_to_swebench
from trialforge.tasks.ingest.trees import materialize
from trialforge.tasks.patches import apply_patch, touched_paths, vet_patch
from trialforge.tasks.snapshots import SnapshotStore

pytestmark = pytest.mark.pure

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"


# --- snapshots ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory) -> SnapshotStore:
    root = tmp_path_factory.mktemp("snapshots")
    return SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")


# --- real git repositories ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Symlink:
    target: str


def _git(repo: Path, *args: str, stdin: bytes | None = None, date: str = "2024-01-01T00:00:00+00:00") -> str:
    env = git_env(repo, date) | {
        "GIT_AUTHOR_NAME": "Jin Park",
        "GIT_AUTHOR_EMAIL": "jpark@example.com",
        "GIT_COMMITTER_NAME": "Jin Park",
        "GIT_COMMITTER_EMAIL": "jpark@example.com",
    }
    done = subprocess.run(["git", *args], cwd=repo, input=stdin, capture_output=True, env=env, check=True)
    return done.stdout.decode().strip()


def _commit(repo: Path, message: str | bytes, files: dict[str, str | bytes | Symlink | None], date: str) -> str:
    for rel, content in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.exists():
            path.unlink()
        if isinstance(content, Symlink):
            path.symlink_to(content.target)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content)
    _git(repo, "add", "-A")
    if isinstance(message, bytes):  # git commit would re-encode invalid UTF-8: write the object by hand
        return _commit_object(repo, message)
    _git(repo, "commit", "-q", "--allow-empty", "-F", "-", stdin=message.encode(), date=date)
    return _git(repo, "rev-parse", "HEAD")


def _commit_object(repo: Path, message: bytes) -> str:
    """A commit whose message bytes are stored exactly as given."""
    tree, parent = _git(repo, "write-tree"), _git(repo, "rev-parse", "HEAD")
    signature = "Jin Park <jpark@example.com> 1709546400 +0000"
    head = f"tree {tree}\nparent {parent}\nauthor {signature}\ncommitter {signature}\n\n".encode()
    sha = _git(repo, "hash-object", "-t", "commit", "-w", "--stdin", stdin=head + message)
    _git(repo, "update-ref", "HEAD", sha)
    return sha


CALC_BUGGY = '''"""Small arithmetic helpers."""


def add(a, b):
    return a - b


def mean(values):
    return sum(values) / len(values)
'''
CALC_FIXED = CALC_BUGGY.replace("a - b", "a + b")
CALC_GUARDED = CALC_FIXED.replace("def mean(values):\n", "def mean(values):\n    if not values:\n        return 0.0\n")
CALC_CLAMP = (
    CALC_GUARDED
    + """

def clamp(x, lo, hi):
    return max(lo, min(x, hi))


def scale(x, k):
    return x * k
"""
)
TEST_MEAN = "from widgets.calc import mean\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n"
TEST_ADD = TEST_MEAN.replace("import mean", "import add, mean") + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
TEST_EMPTY = TEST_ADD + "\n\ndef test_mean_of_nothing():\n    assert mean([]) == 0.0\n"
TEST_CLAMP = (
    TEST_EMPTY
    + """

def test_clamp():
    from widgets.calc import clamp, scale

    assert clamp(5, 0, 3) == 3
    assert scale(2, 3) == 6
"""
)
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01"


def _day(n: int) -> str:
    return f"2024-03-{n:02d}T10:00:00+00:00"


@pytest.fixture(scope="module")
def widgets(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """acme/widgets: a bug, its fix (PROJ-1), docs, a binary, a merged branch, multi-key, code-only, latin-1, huge."""
    repo = tmp_path_factory.mktemp("widgets")
    _git(repo, "init", "-q", "-b", "main")
    sha = {}
    sha["c1"] = _commit(
        repo,
        "Initial widgets package",
        {
            "README.md": "# widgets\n",
            "widgets/__init__.py": "",
            "widgets/calc.py": CALC_BUGGY,
            "tests/test_calc.py": TEST_MEAN,
        },
        "2024-02-27T10:00:00+00:00",
    )
    sha["c2"] = _commit(
        repo,
        "PROJ-1: fix add() subtracting instead of adding\n\nThe operator was flipped.",
        {"widgets/calc.py": CALC_FIXED, "tests/test_calc.py": TEST_ADD},
        _day(1),
    )
    sha["c3"] = _commit(repo, "Update README for PROJ-1", {"README.md": "# widgets\n\nadd() adds.\n"}, _day(2))
    sha["c4"] = _commit(
        repo,
        "Add logo and its test",
        {"widgets/logo.png": PNG, "tests/test_logo.py": "def test_logo():\n    pass\n"},
        _day(3),
    )
    _git(repo, "checkout", "-q", "-b", "feature")
    sha["c5"] = _commit(
        repo,
        "Guard mean() against empty input\n\nmean([]) raised ZeroDivisionError; an empty list should average to 0.0."
        "\n\nRefs PROJ-2.",
        {"widgets/calc.py": CALC_GUARDED, "tests/test_calc.py": TEST_EMPTY},
        _day(4),
    )
    _git(repo, "checkout", "-q", "main")
    _git(repo, "merge", "-q", "--no-ff", "feature", "-m", "Merge branch 'feature' (PROJ-2)", date=_day(5))
    sha["merge"] = _git(repo, "rev-parse", "HEAD")
    sha["c6"] = _commit(
        repo,
        "PROJ-3 PROJ-4: add clamp() and scale()\n\nCallers had no way to bound a value to a range or to multiply"
        " it by a factor.",
        {"widgets/calc.py": CALC_CLAMP, "tests/test_calc.py": TEST_CLAMP},
        _day(6),
    )
    sha["c7"] = _commit(
        repo,
        "PROJ-5: tidy calc docstring",
        {"widgets/calc.py": CALC_CLAMP.replace("Small arithmetic", "Tiny arithmetic")},
        _day(7),
    )
    sha["c8"] = _commit(
        repo,
        "Add latin-1 greeting (PROJ-12)",
        {"widgets/greet.py": b"GREETING = 'caf\xe9'\n", "tests/test_greet.py": "def test_greet():\n    pass\n"},
        _day(8),
    )
    table = "".join(f"ROW_{i} = {i}\n" for i in range(300))
    sha["c9"] = _commit(
        repo,
        "Generate lookup table",
        {"widgets/table.py": table, "tests/test_table.py": "def test_table():\n    pass\n"},
        _day(9),
    )
    return repo, sha


@pytest.fixture(scope="module")
def evil(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """acme/evil: a symlink to /etc/passwd, a later commit on top of it, and a latin-1 commit message."""
    repo = tmp_path_factory.mktemp("evil")
    _git(repo, "init", "-q", "-b", "main")
    test = "from pkg.mod import f\n\n\ndef test_f():\n    assert f() == {}\n"
    sha = {}
    mod = "def f():\n    return {}\n"
    sha["e1"] = _commit(
        repo,
        "Initial",
        {"pkg/__init__.py": "", "pkg/mod.py": mod.format(1), "tests/test_mod.py": test.format(1)},
        _day(1),
    )
    sha["e2"] = _commit(
        repo,
        "Link the password file",
        {"pkg/passwd": Symlink("/etc/passwd"), "tests/test_mod.py": test.format(1) + "# see pkg/passwd\n"},
        _day(2),
    )
    sha["e3"] = _commit(
        repo,
        "Return 2 from f()\n\nCallers of f() expect the second version's value, not the first one.",
        {"pkg/mod.py": mod.format(2), "tests/test_mod.py": test.format(2)},
        _day(3),
    )
    sha["e4"] = _commit(
        repo, b"Caf\xe9: return 3 from f()", {"pkg/mod.py": mod.format(3), "tests/test_mod.py": test.format(3)}, _day(4)
    )
    return repo, sha


def _fill(src: Path, dest: Path, shas: dict[str, str]) -> Path:
    """Copy a fixture export, replacing ``{{sha:NAME}}`` with the commit built at test time."""
    data = re.sub(rb"\{\{sha:(\w+)\}\}", lambda m: shas[m.group(1).decode()].encode(), src.read_bytes())
    dest.write_bytes(data)
    return dest


def _reasons(funnel: IngestFunnel) -> dict[str, str]:
    """ref -> reason for every dropped record (the ref's first word is its file:line or commit)."""
    return {d["ref"].split(" ")[0]: d["reason"] for d in funnel.details}


def _fixed_tree(snapshots: SnapshotStore, digest: str, dest: Path, gold: str, tests: str) -> Path:
    """A copy of the base-state snapshot with the test patch and gold patch applied."""
    tree = dest / "fixed"
    shutil.copytree(snapshots.materialize(digest), tree, symlinks=True)
    assert not (tree / ".git").exists()
    apply_patch(tree, tests)
    apply_patch(tree, gold)
    return tree


# --- repositories at a commit ---------------------------------------------------------------------------


def test_materialize_writes_the_commit_tree_without_history_even_for_export_ignored_paths(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    sha = _commit(
        repo,
        "init",
        {
            ".gitattributes": "tests export-ignore\nversion.txt export-subst\n",
            "version.txt": "$Format:%H$\n",
            "run.sh": "#!/bin/sh\n",
            "tests/test_x.py": "def test_x():\n    pass\n",
            "docs/readme": Symlink("../version.txt"),
        },
        _day(1),
    )
    (repo / "run.sh").chmod(0o755)
    sha = _commit(repo, "exec bit", {}, _day(2))
    dest = tmp_path / "out"
    materialize(repo, sha, dest)
    assert (dest / "tests" / "test_x.py").is_file(), "export-ignore must not drop tests"
    assert (dest / "version.txt").read_text() == "$Format:%H$\n", "export-subst must not rewrite files"
    assert os.readlink(dest / "docs" / "readme") == "../version.txt"
    assert os.access(dest / "run.sh", os.X_OK)
    assert not (dest / ".git").exists()


@pytest.mark.parametrize(
    ("links", "message"),
    [
        ({"pkg/passwd": Symlink("/etc/passwd")}, "points outside"),
        ({"pkg/up": Symlink("../../..")}, "points outside"),
        ({"sub/up": Symlink(".."), "esc": Symlink("sub/up/..")}, "resolves outside"),  # only a chain escapes
    ],
)
def test_materialize_refuses_symlinks_that_leave_the_tree(tmp_path, links, message):
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    sha = _commit(repo, "links", {"a.py": "x = 1\n", **links}, _day(1))
    with pytest.raises(RepoError, match=message) as caught:
        materialize(repo, sha, tmp_path / "out")
    assert caught.value.reason == "unsafe_tree"
    assert sha in str(caught.value)


def test_a_plain_directory_inside_another_repository_is_not_a_mirror(widgets):
    repo, _ = widgets
    with Mirrors({"inner": repo / "widgets", "outer": repo}) as mirrors:
        assert mirrors.get("outer") == repo.resolve()
        with pytest.raises(RepoError, match="is not a git repository") as caught:
            mirrors.get("inner")
    assert caught.value.reason == "unknown_repository"


def test_vet_patch_names_the_reason_and_the_file():
    binary = "diff --git a/x.png b/x.png\nnew file mode 100644\nBinary files /dev/null and b/x.png differ\n"
    escaping = "diff --git a/../x.py b/../x.py\n--- a/../x.py\n+++ b/../x.py\n@@ -1 +1 @@\n-a\n+b\n"
    link = "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/etc/shadow\n"
    huge = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+" + "b" * 2000 + "\n"
    cases = [
        (binary, "binary_change", "x.png"),
        (escaping, "unsafe_patch", "../x.py"),
        (link, "unsafe_patch", "/etc/shadow"),
    ]
    for patch, reason, named in cases:
        with pytest.raises(PatchError) as caught:
            vet_patch(patch, "p")
        assert (caught.value.reason, named in str(caught.value)) == (reason, True)
    with pytest.raises(PatchError) as caught:
        vet_patch(huge, "p", max_bytes=1000, setting=MAX_PATCH_BYTES_SETTING)
    assert caught.value.reason == "oversize_patch"
    assert f"p is {len(huge):,} bytes > 1,000 (sources.caps.max_patch_bytes)" in str(caught.value)


def test_json_array_records_carry_their_line_and_a_broken_element_stops_only_the_rest(tmp_path):
    path = tmp_path / "export.json"
    path.write_text('[\n  {"a": 1},\n  {"b": "\\udc80"},\n  "text",\n  {"c": 3},\n  {"d": oops},\n  {"e": 5}\n]\n')
    funnel = IngestFunnel("t")
    records = list(read_json_records(path, funnel))
    assert [(r.where, r.data) for r in records] == [("export.json:2", {"a": 1}), ("export.json:5", {"c": 3})]
    assert _reasons(funnel) == {
        "export.json:3": "bad_encoding",
        "export.json:4": "invalid_record",
        "export.json:6": "malformed_json",
    }


def test_json_lines_over_the_record_cap_are_dropped_unparsed_with_their_line_and_size(tmp_path):
    path = tmp_path / "big.jsonl"
    cap = 1 << 20
    exact = json.dumps({"n": 3, "pad": ""})
    exact = exact.replace('""', '"' + "x" * (cap - len(exact)) + '"')  # exactly the cap: kept
    giant = "{not json at all" + "y" * (3 * cap)  # 3 MiB, unparseable: must be refused by size, unread
    path.write_text("\n".join(['{"n": 1}', giant, '{"n": 2}', exact, "z" * (cap + 1)]) + "\n")
    funnel = IngestFunnel("t")
    records = list(read_json_records(path, funnel, caps=IngestCaps(max_record_bytes=cap)))
    assert [(r.where, r.data["n"]) for r in records] == [("big.jsonl:1", 1), ("big.jsonl:3", 2), ("big.jsonl:4", 3)]
    assert _reasons(funnel) == {"big.jsonl:2": "oversize_record", "big.jsonl:5": "oversize_record"}
    details = {d["ref"]: d["detail"] for d in funnel.details}
    assert details["big.jsonl:2"] == f"line 2 is {len(giant):,} bytes > 1,048,576 (sources.caps.max_record_bytes)"
    assert details["big.jsonl:5"] == "line 5 is 1,048,577 bytes > 1,048,576 (sources.caps.max_record_bytes)"


def test_json_array_elements_over_the_record_cap_are_dropped_with_their_line(tmp_path):
    path = tmp_path / "export.json"
    path.write_text('[\n  {"a": 1},\n  {"b": "' + "\u00e9" * 60 + '"},\n  {"c": 3}\n]\n')
    funnel = IngestFunnel("t")
    records = list(read_json_records(path, funnel, caps=IngestCaps(max_record_bytes=100)))
    assert [r.where for r in records] == ["export.json:2", "export.json:4"]
    assert _reasons(funnel) == {"export.json:3": "oversize_record"}  # 69 characters, but 129 bytes
    assert funnel.details[0]["detail"] == "array element is 129 bytes > 100 (sources.caps.max_record_bytes)"


# --- SWE-bench ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swebench_run(widgets, evil, snapshots, tmp_path_factory):
    (repo, sha), (evil_repo, evil_sha) = widgets, evil
    path = _fill(FIXTURES / "swebench.jsonl", tmp_path_factory.mktemp("swe") / "swebench.jsonl", {**sha, **evil_sha})
    tasks, funnel = ingest_swebench(path, {"acme/widgets": repo, "acme/evil": evil_repo}, snapshots)
    return path, tasks, funnel


def test_swebench_instances_become_tasks_whose_base_state_has_the_bug(swebench_run, snapshots, tmp_path):
    _, tasks, funnel = swebench_run
    assert [t.task_id for t in tasks] == ["acme__widgets-10", "acme__widgets-12"]
    first, second = tasks
    assert first.fail_to_pass == ["tests/test_calc.py::test_add"]
    assert second.pass_to_pass == ["tests/test_calc.py::test_mean", "tests/test_calc.py::test_add"]
    base = snapshots.materialize(first.snapshot)
    assert "return a - b" in (base / "widgets" / "calc.py").read_text()
    assert not (base / "tests" / "test_calc.py").read_text().count("test_add")
    fixed = _fixed_tree(snapshots, first.snapshot, tmp_path, first.gold_patch, first.test_patch)
    assert "return a + b" in (fixed / "widgets" / "calc.py").read_text()
    assert "def test_add" in (fixed / "tests" / "test_calc.py").read_text()
    assert (funnel.kept, funnel.seen) == (2, 14)


def test_swebench_bad_instances_are_reported_by_line_and_the_rest_kept(swebench_run):
    _, _, funnel = swebench_run
    assert _reasons(funnel) == {
        "swebench.jsonl:3": "malformed_json",
        "swebench.jsonl:4": "invalid_record",
        "swebench.jsonl:5": "patch_does_not_apply",
        "swebench.jsonl:6": "unsafe_patch",
        "swebench.jsonl:7": "binary_change",
        "swebench.jsonl:8": "bad_encoding",
        "swebench.jsonl:9": "unknown_repository",
        "swebench.jsonl:10": "unknown_commit",
        "swebench.jsonl:11": "unsafe_tree",
        "swebench.jsonl:12": "duplicate",
        "swebench.jsonl:13": "invalid_record",
        "swebench.jsonl:14": "unsafe_patch",
    }
    details = {d["ref"]: d["detail"] for d in funnel.details}
    assert "base_commit" in details["swebench.jsonl:4"]
    assert "problem_statement" in details["swebench.jsonl:8"]
    assert "/etc/passwd" in details["swebench.jsonl:14"]


def test_swebench_instances_round_trip_losslessly(swebench_run):
    path, _, _ = swebench_run
    instances = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            instances.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    odd: dict[str, Any] = {
        "instance_id": "x__y-1",
        "repo": "x/y",
        "base_commit": "abc",
        "patch": "p",
        "test_patch": "t",
        "problem_statement": "s",
        "hints_text": None,  # null, not ""
        "FAIL_TO_PASS": '["a","b"]',  # JSON text without the usual spaces
        "PASS_TO_PASS": [],
        "image_assets": {"problem_statement": ["https://example.com/a.png"]},  # a variant's extra field
    }  # created_at, version, environment_setup_commit: absent
    checked = 0
    for instance in [*instances, odd]:
        try:
            task = task_from_swebench(instance)
        except TaskError:  # the fixture's deliberately invalid instances
            continue
        assert task_to_swebench(task) == instance
        assert task_to_swebench(type(task).from_row(task.to_row())) == instance  # through a Parquet row too
        checked += 1
    assert checked >= 10


def test_swebench_export_reflects_edits_to_the_task():
    instance = {
        "instance_id": "x__y-2",
        "repo": "x/y",
        "base_commit": "abc",
        "patch": "p",
        "test_patch": "t",
        "problem_statement": "s",
        "FAIL_TO_PASS": '["a"]',
        "PASS_TO_PASS": '["b"]',
    }
    task = task_from_swebench(instance).model_copy(update={"fail_to_pass": ["a", "c"], "hints": "new hint"})
    out = task_to_swebench(task)
    assert out["FAIL_TO_PASS"] == '["a", "c"]' and out["PASS_TO_PASS"] == '["b"]'
    assert out["hints_text"] == "new hint" and out["base_commit"] == "abc"
    assert split_extras(task.source.ref)[0] == "x__y-2"


def test_swebench_oversize_and_empty_instances_are_dropped_by_line_and_the_rest_kept(
    swebench_run, widgets, snapshots, tmp_path
):
    (filled, _, _), (repo, _) = swebench_run, widgets
    good = json.loads(filled.read_text(errors="replace").splitlines()[0])
    padded_patch = good["patch"].replace("+    return a + b\n", "+    return a + b  # " + "p" * 3000 + "\n")

    def variant(number: int, **fields: Any) -> str:
        instance = {**good, "instance_id": f"acme__widgets-{number}", **fields}
        return json.dumps({k: v for k, v in instance.items() if v is not None})

    lines = [
        variant(101),  # kept
        variant(102, problem_statement="s" * 1001),
        variant(103, hints_text="h" * 1001),
        variant(104, patch=padded_patch),
        variant(105, PASS_TO_PASS=[f"tests/test_calc.py::test_{i}" for i in range(5)]),  # 1 + 5 tests
        variant(106, FAIL_TO_PASS=[]),
        variant(107, FAIL_TO_PASS="[]"),
        variant(108, problem_statement="x" * 20_000),  # the line itself is over the record cap
        json.dumps({k: v for k, v in good.items() if k != "FAIL_TO_PASS"} | {"instance_id": "acme__widgets-109"}),
        variant(110, problem_statement="s" * 1000),  # exactly the cap: kept
    ]
    path = tmp_path / "caps.jsonl"
    path.write_text("\n".join(lines) + "\n")
    caps = IngestCaps(max_statement_chars=1000, max_patch_bytes=3000, max_tests=5, max_record_bytes=10_000)
    tasks, funnel = ingest_swebench(path, {"acme/widgets": repo}, snapshots, caps=caps)
    assert [t.task_id for t in tasks] == ["acme__widgets-101", "acme__widgets-109", "acme__widgets-110"]
    assert tasks[1].fail_to_pass == []  # absent: validation finds the tests
    assert _reasons(funnel) == {
        "caps.jsonl:2": "oversize_statement",
        "caps.jsonl:3": "oversize_hints",
        "caps.jsonl:4": "oversize_patch",
        "caps.jsonl:5": "too_many_tests",
        "caps.jsonl:6": "empty_fail_to_pass",
        "caps.jsonl:7": "empty_fail_to_pass",
        "caps.jsonl:8": "oversize_record",
    }
    details = {d["ref"]: d["detail"] for d in funnel.details}
    assert details["caps.jsonl:2"] == (
        "acme__widgets-102: problem statement is 1,001 chars > 1,000 (sources.caps.max_statement_chars)"
    )
    assert (
        details["caps.jsonl:3"] == "acme__widgets-103: hints is 1,001 chars > 1,000 (sources.caps.max_statement_chars)"
    )
    assert "gold patch is 3," in details["caps.jsonl:4"] and "(sources.caps.max_patch_bytes)" in details["caps.jsonl:4"]
    assert (
        details["caps.jsonl:5"]
        == "acme__widgets-105: FAIL_TO_PASS + PASS_TO_PASS is 6 tests > 5 (sources.caps.max_tests)"
    )
    assert "no test shows the fix" in details["caps.jsonl:6"] and "'[]'" in details["caps.jsonl:7"]
    assert (
        details["caps.jsonl:8"].startswith("line 8 is 2")
        and "> 10,000 (sources.caps.max_record_bytes)" in details["caps.jsonl:8"]
    )


def test_env_commit_is_the_environment_setup_commit_else_the_base_commit():
    instance = {
        "instance_id": "x__y-1",
        "repo": "x/y",
        "base_commit": "b" * 40,
        "patch": "p",
        "test_patch": "t",
        "problem_statement": "s",
    }
    task = task_from_swebench(instance)
    assert env_commit(task) == "b" * 40
    assert env_commit(task_from_swebench(instance | {"environment_setup_commit": "e" * 40})) == "e" * 40
    assert env_commit(task_from_swebench(instance | {"environment_setup_commit": ""})) == "b" * 40
    bare = task.model_copy(update={"source": task.source.model_copy(update={"ref": "x__y-1"})})  # no extras
    assert env_commit(bare) is None


def test_swebench_repository_may_be_a_clone_url(widgets, snapshots, swebench_run, tmp_path):
    (repo, _), (filled, tasks, _) = widgets, swebench_run
    path = tmp_path / "one.jsonl"
    path.write_bytes(filled.read_bytes().split(b"\n")[0])
    cloned, funnel = ingest_swebench(path, {"acme/widgets": f"file://{repo}"}, snapshots, clone_dir=tmp_path / "clones")
    assert funnel.kept == 1 and cloned[0].snapshot == tasks[0].snapshot
    assert (tmp_path / "clones" / "acme_widgets" / "HEAD").is_file()


# --- GitHub REST --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "refs"),
    [
        ("Fixes #3", [("acme/widgets", 3)]),
        ("closes #3, resolved #4 and FIXED #5", [("acme/widgets", 3), ("acme/widgets", 4), ("acme/widgets", 5)]),
        ("Close: #7", [("acme/widgets", 7)]),
        ("Resolves acme/widgets#7", [("acme/widgets", 7)]),
        ("fixes Other/Lib#4", [("other/lib", 4)]),
        ("Fix https://github.com/acme/widgets/issues/22", [("acme/widgets", 22)]),
        ("see #5", []),
        ("Fixed in #5; related to #6; hotfix #7; prefix#8; #9", []),
        ("fixes #10a", []),
    ],
)
def test_closing_keywords_link_and_mentions_do_not(text, refs):
    assert closing_refs(text, "acme/widgets") == refs


@pytest.fixture(scope="module")
def github_run(widgets, snapshots, tmp_path_factory):
    repo, sha = widgets
    path = _fill(FIXTURES / "github_export.json", tmp_path_factory.mktemp("gh") / "github_export.json", sha)
    return ingest_github_rest(path, {"acme/widgets": repo}, snapshots)


def test_github_merged_prs_that_close_issues_become_tasks(github_run, snapshots, tmp_path):
    tasks, funnel = github_run
    assert [t.task_id for t in tasks] == ["acme__widgets-10", "acme__widgets-12"]
    add, mean = tasks
    assert add.problem_statement.startswith("add() subtracts its arguments\n`add(2, 3)` returns")
    assert "mean([]) raises" in mean.problem_statement and "should be 0.0" in mean.problem_statement  # two issues
    assert touched_paths(add.gold_patch) == ["widgets/calc.py"]
    assert touched_paths(add.test_patch) == ["tests/test_calc.py"]
    ref, extras = split_extras(add.source.ref)
    assert ref == "https://github.com/acme/widgets/pull/10" and extras["issues"] == [
        "https://github.com/acme/widgets/issues/3"
    ]
    base = snapshots.materialize(add.snapshot)
    assert "return a - b" in (base / "widgets" / "calc.py").read_text()
    fixed = _fixed_tree(snapshots, mean.snapshot, tmp_path, mean.gold_patch, mean.test_patch)
    assert "if not values:" in (fixed / "widgets" / "calc.py").read_text()
    assert {(link["task_id"], link["ticket"].rsplit("/", 1)[1]) for link in funnel.links} == {
        ("acme__widgets-10", "3"),
        ("acme__widgets-12", "7"),
        ("acme__widgets-12", "22"),
    }


def test_github_hints_are_only_comments_from_before_work_began(github_run):
    add = github_run[0][0]
    assert add.hints == "I think the sign is flipped in add()."  # 08:00; the first commit was at 09:30


def test_github_unusable_records_are_reported_with_reasons(github_run):
    _, funnel = github_run
    by_url = {d["ref"].split("(")[-1].rstrip(")"): d["reason"] for d in funnel.details}
    pulls = {k.rsplit("/", 1)[1]: v for k, v in by_url.items() if "/pull/" in k}
    issues = {k.rsplit("/", 1)[1]: v for k, v in by_url.items() if "/issues/" in k}
    assert pulls == {
        "11": "unmerged_pr",
        "13": "no_linked_issue",  # "fixes other/lib#4" is not acme/widgets#4
        "14": "no_test_changes",
        "15": "binary_change",
        "16": "unsafe_patch",
        "17": "patch_does_not_apply",
    }
    assert issues == {
        "4": "no_linked_pr",
        "5": "no_linked_pr",  # "see #5" is a mention
        "6": "fix_not_merged",
        "8": "fix_pr_dropped",
        "9": "fix_pr_dropped",
        "20": "fix_pr_dropped",
        "21": "fix_pr_dropped",
    }
    assert funnel.dropped["pull_request_listed_as_issue"] == 1
    assert any("closes other/lib#4" in d["detail"] for d in funnel.details)
    assert all(re.match(r"github_export\.json:\d+", d["ref"]) for d in funnel.details)


def test_github_json_lines_export_keeps_good_records_among_bad_lines(widgets, snapshots, tmp_path):
    repo, sha = widgets
    path = _fill(FIXTURES / "github_export.jsonl", tmp_path / "github_export.jsonl", sha)
    tasks, funnel = ingest_github_rest(path, {"acme/widgets": repo}, snapshots)
    assert [t.task_id for t in tasks] == ["acme__widgets-31"]
    assert _reasons(funnel) == {
        "github_export.jsonl:3": "malformed_json",
        "github_export.jsonl:4": "bad_encoding",
        "github_export.jsonl:5": "invalid_record",
        "github_export.jsonl:6": "invalid_record",
    }


def test_github_rest_oversize_statement_and_record_are_dropped_and_the_rest_kept(widgets, snapshots, tmp_path):
    repo, sha = widgets
    path = _fill(FIXTURES / "github_export.jsonl", tmp_path / "github_export.jsonl", sha)
    lines = path.read_bytes().rstrip(b"\n").split(b"\n")
    issue = json.loads(lines[0])
    huge = dict(issue, number=90, html_url="https://github.com/acme/widgets/issues/90", body="b" * 40_000)
    path.write_bytes(b"\n".join([*lines, json.dumps(huge).encode()]) + b"\n")
    caps = IngestCaps(max_record_bytes=30_000)
    tasks, funnel = ingest_github_rest(path, {"acme/widgets": repo}, snapshots, caps=caps)
    assert [t.task_id for t in tasks] == ["acme__widgets-31"]
    assert _reasons(funnel)[f"github_export.jsonl:{len(lines) + 1}"] == "oversize_record"

    statement_cap = IngestCaps(max_statement_chars=len(tasks[0].problem_statement) - 1)
    none, funnel = ingest_github_rest(path, {"acme/widgets": repo}, snapshots, caps=statement_cap)
    assert none == []
    dropped = {d["reason"]: d["detail"] for d in funnel.details}
    assert "acme__widgets-31: problem statement is" in dropped["oversize_statement"]
    assert dropped["fix_pr_dropped"].endswith("was dropped: oversize_statement")


# --- Jira -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jira_run(widgets, snapshots):
    repo, _ = widgets
    return ingest_jira(FIXTURES / "jira_export.csv", repo, snapshots, repo_name="widgets")


def test_link_confidence_rule():
    assert link_confidence("at start of subject", 1, 1) == 1.0
    assert link_confidence("in subject", 1, 1) == 0.8
    assert link_confidence("only in body", 1, 1) == 0.5
    assert link_confidence("at start of subject", 2, 1) == 0.75
    assert link_confidence("in subject", 1, 3) == 0.45


def test_jira_tickets_link_to_commits_with_confidence(jira_run, widgets):
    tasks, funnel = jira_run
    _, sha = widgets
    got = {t.task_id: (split_extras(t.source.ref)[1]["fix_commit"], t.source.link_confidence) for t in tasks}
    assert got == {
        "widgets-PROJ-1": (sha["c2"], 0.75),  # key opens the subject; PROJ-1 has two commits
        "widgets-PROJ-2": (sha["c5"], 0.5),  # only in the body; the merge commit is not a candidate
        "widgets-PROJ-3": (sha["c6"], 0.75),  # opens the subject of a commit naming two keys
        "widgets-PROJ-4": (sha["c6"], 0.6),  # in the subject of that commit
    }
    unused = {(link["ticket"], link["fix"]) for link in funnel.links if not link["used"]}
    assert unused == {("PROJ-1", sha["c3"]), ("PROJ-5", sha["c7"])}  # a less confident follow-up; a code-only commit
    assert not any(link["fix"] == sha["c8"] for link in funnel.links), "PROJ-12 is not PROJ-1"


def test_jira_fix_is_the_commit_diff_on_its_parent(jira_run, snapshots, tmp_path):
    task = jira_run[0][0]
    assert task.problem_statement.startswith("add() subtracts its arguments\n\nSteps to reproduce:\n# call")
    assert task.created_at == "2024-02-28T09:00:00+00:00"
    assert task.hints == "Looks like a sign error in calc.py."  # the 2 March comment came after the fix
    assert touched_paths(task.gold_patch) == ["widgets/calc.py"] and touched_paths(task.test_patch) == [
        "tests/test_calc.py"
    ]
    fixed = _fixed_tree(snapshots, task.snapshot, tmp_path, task.gold_patch, task.test_patch)
    assert (fixed / "widgets" / "calc.py").read_text() == CALC_FIXED
    assert "return a - b" in (snapshots.materialize(task.snapshot) / "widgets" / "calc.py").read_text()


def test_jira_rows_that_cannot_become_tasks_are_reported_by_line(jira_run):
    _, funnel = jira_run
    assert _reasons(funnel) == {
        "jira_export.csv:10": "no_test_changes",  # PROJ-5: code only
        "jira_export.csv:11": "not_fixed",  # PROJ-6: Won't Fix
        "jira_export.csv:12": "unresolved",  # PROJ-7
        "jira_export.csv:13": "no_linked_commit",  # PROJ-8
        "jira_export.csv:14": "bad_encoding",  # PROJ-9: latin-1 bytes in the description
        "jira_export.csv:15": "malformed_row",  # PROJ-10: too few fields
        "jira_export.csv:16": "no_linked_commit",  # PROJ-11: read after the bad rows
    }
    assert (funnel.kept, funnel.seen) == (4, 11)


def _csv_with(rows: list[list[str]]) -> tuple[str, list[int]]:
    """CSV text of ``rows`` and the line each row starts on."""
    out, starts = io.StringIO(), []
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        starts.append(out.getvalue().count("\n") + 1)
        writer.writerow(row)
    return out.getvalue(), starts


def test_jira_oversize_rows_and_statements_are_dropped_by_line_and_the_rest_kept(widgets, snapshots, tmp_path):
    repo, _ = widgets
    with (FIXTURES / "jira_export.csv").open(encoding="utf-8", errors="surrogateescape", newline="") as fh:
        rows = list(csv.reader(fh))
    header = rows[0]
    by_key = {row[1]: row for row in rows[1:] if len(row) == len(header)}
    description, comment = header.index("Description"), header.index("Comment")
    long_statement = list(by_key["PROJ-1"])
    long_statement[description] = "d" * 5_000
    big_field = list(by_key["PROJ-2"])
    big_field[description] = "f" * 30_000  # one field over the cap: the csv module stops there
    big_row = list(by_key["PROJ-3"])
    big_row[description], big_row[comment] = "r" * 15_000, "c" * 15_000  # each under, together over
    text, starts = _csv_with([header, long_statement, big_field, big_row, by_key["PROJ-4"]])
    path = tmp_path / "jira.csv"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    limit = csv.field_size_limit()
    caps = IngestCaps(max_statement_chars=4_000, max_record_bytes=20_000)
    tasks, funnel = ingest_jira(path, repo, snapshots, repo_name="widgets", caps=caps)
    assert csv.field_size_limit() == limit, "the csv module's process-wide limit is restored"
    assert [t.task_id for t in tasks] == ["widgets-PROJ-4"]
    assert _reasons(funnel) == {
        f"jira.csv:{starts[1]}": "oversize_statement",
        f"jira.csv:{starts[2]}": "oversize_record",
        f"jira.csv:{starts[3]}": "oversize_record",
    }
    details = [funnel.details[i]["detail"] for i in (2, 0, 1)]  # the rows over the record cap go first, as read
    assert details[0] == "PROJ-1: summary and description are 5,031 chars > 4,000 (sources.caps.max_statement_chars)"
    assert details[1] == "a field of the row is over 20,000 (sources.caps.max_record_bytes)"
    assert details[2].startswith("row is 30,") and details[2].endswith("> 20,000 (sources.caps.max_record_bytes)")


def test_jira_dates_parse_in_the_export_zone():
    assert parse_jira_date("05/Mar/24 4:05 PM") == datetime(2024, 3, 5, 16, 5, tzinfo=UTC)
    berlin = timezone(timedelta(hours=1))
    assert parse_jira_date("05/Mar/24 4:05 PM", berlin) == datetime(2024, 3, 5, 15, 5, tzinfo=UTC)
    assert parse_jira_date("2024-03-05T16:05:00+01:00") == datetime(2024, 3, 5, 16, 5, tzinfo=berlin)
    assert parse_jira_date("yesterday") is None


# --- git history ----------------------------------------------------------------------------------------


def test_git_history_keeps_commits_that_change_code_and_tests(widgets, snapshots, tmp_path):
    repo, sha = widgets
    tasks, funnel = ingest_git_history(repo, snapshots, repo_name="widgets", max_changed_lines=200)
    assert [split_extras(t.source.ref)[0] for t in tasks] == [sha["c2"], sha["c5"], sha["c6"]]
    assert all(t.source.kind == "git" and t.source.link_confidence == GITLOG_CONFIDENCE for t in tasks)
    assert tasks[0].problem_statement == "PROJ-1: fix add() subtracting instead of adding\n\nThe operator was flipped."
    reasons = {ref.split("@")[1]: reason for ref, reason in _reasons(funnel).items()}
    assert reasons == {
        sha["c1"]: "root_commit",
        sha["c3"]: "no_test_changes",
        sha["c4"]: "binary_change",
        sha["merge"]: "merge_commit",
        sha["c7"]: "no_test_changes",
        sha["c8"]: "bad_encoding",
        sha["c9"]: "huge_diff",
    }
    fixed = _fixed_tree(snapshots, tasks[1].snapshot, tmp_path, tasks[1].gold_patch, tasks[1].test_patch)
    assert (fixed / "widgets" / "calc.py").read_text() == CALC_GUARDED


def test_git_history_refuses_outside_symlinks_and_undecodable_messages(evil, snapshots):
    repo, sha = evil
    tasks, funnel = ingest_git_history(repo, snapshots)
    assert tasks == []
    reasons = {ref.split("@")[1]: reason for ref, reason in _reasons(funnel).items()}
    assert reasons == {
        sha["e1"]: "root_commit",
        sha["e2"]: "unsafe_patch",  # the diff makes a symlink to /etc/passwd
        sha["e3"]: "unsafe_tree",  # its parent's tree holds that symlink
        sha["e4"]: "bad_encoding",  # latin-1 message without an encoding header
    }
