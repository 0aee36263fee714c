"""Patches: safe application, tree diffs that re-apply, splitting code from tests, replay as tool calls."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trialforge.errors import PatchError
from trialforge.rollout.policies import patch_to_actions
from trialforge.tasks.patches import apply_patch, diff_trees, filter_patch, is_test_path, touched_paths, vet_patch
from trialforge.tasks.patches import test_files as files_of_tests  # not "test_*": pytest would collect it
from trialforge.tasks.pytestconfig import python_files_of
from trialforge.verify.grader import restore_tests

pytestmark = pytest.mark.pure


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_diff_then_apply_reproduces_the_after_tree(tmp_path):
    before = _tree(tmp_path / "before", {"pkg/a.py": "x = 1\ny = 2\n", "pkg/gone.py": "z\n", "tail.txt": "no newline"})
    after = _tree(tmp_path / "after", {"pkg/a.py": "x = 1\ny = 3\n", "pkg/new.py": "w = 0\n", "tail.txt": "changed"})
    diff = diff_trees(before, after)
    target = tmp_path / "target"
    shutil.copytree(before, target)
    apply_patch(target, diff)
    assert diff_trees(target, after) == ""
    assert (target / "pkg" / "new.py").read_text() == "w = 0\n"
    assert not (target / "pkg" / "gone.py").exists()


def test_reverse_apply_restores_the_before_tree(tmp_path):
    before = _tree(tmp_path / "b", {"m.py": "a\nb\nc\n"})
    after = _tree(tmp_path / "a", {"m.py": "a\nB\nc\n"})
    diff = diff_trees(before, after)
    apply_patch(after, diff, reverse=True)
    assert (after / "m.py").read_text() == "a\nb\nc\n"


@pytest.mark.parametrize(
    "path",
    ["../outside.py", "/etc/passwd", "pkg/../../x.py", ".git/config"],
)
def test_paths_escaping_the_repository_are_refused(path):
    patch = f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(PatchError, match=r"escapes|git metadata"):
        vet_patch(patch)


def test_binary_and_empty_patches_are_refused():
    with pytest.raises(PatchError, match="binary"):
        vet_patch("diff --git a/x.bin b/x.bin\nGIT binary patch\nliteral 0\n")
    with pytest.raises(PatchError, match="empty"):
        vet_patch("  \n")


def test_patch_that_does_not_apply_names_the_problem(tmp_path):
    _tree(tmp_path, {"m.py": "hello\n"})
    patch = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-goodbye\n+x\n"
    with pytest.raises(PatchError, match="does not apply"):
        apply_patch(tmp_path, patch)
    assert (tmp_path / "m.py").read_text() == "hello\n"


def test_symlink_escape_is_refused(tmp_path):
    repo = _tree(tmp_path / "repo", {"ok.py": "x\n"})
    (repo / "link").symlink_to(tmp_path)
    patch = (
        "diff --git a/link/evil.py b/link/evil.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/link/evil.py\n@@ -0,0 +1 @@\n+x\n"
    )
    with pytest.raises(PatchError):
        apply_patch(repo, patch)
    assert not (tmp_path / "evil.py").exists()


def test_a_patch_making_a_symlink_that_points_outside_is_refused_before_it_applies(tmp_path):
    repo = _tree(tmp_path / "repo", {"ok.py": "x\n"})
    patch = "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+../../secret\n"
    with pytest.raises(PatchError, match="pointing outside") as caught:
        apply_patch(repo, patch)
    assert caught.value.reason == "unsafe_patch" and not (repo / "l").is_symlink()


def test_split_code_from_tests_and_runner_config(tmp_path):
    before = _tree(tmp_path / "b", {"pkg/m.py": "a\n", "tests/test_m.py": "t\n", "conftest.py": "c\n"})
    after = _tree(tmp_path / "a", {"pkg/m.py": "b\n", "tests/test_m.py": "T\n", "conftest.py": "C\n"})
    code, dropped = filter_patch(diff_trees(before, after), lambda p: not is_test_path(p))
    assert "pkg/m.py" in code and "tests/" not in code
    assert sorted(dropped) == ["conftest.py", "tests/test_m.py"]


@pytest.mark.parametrize(
    ("path", "is_test"),
    [("tests/test_x.py", True), ("pkg/test_x.py", True), ("pkg/x_test.py", True), ("conftest.py", True),
     ("sub/conftest.py", True), ("pytest.ini", True), ("setup.cfg", True), ("pyproject.toml", True),
     ("sitecustomize.py", True), ("pkg/evil.pth", True), ("pkg/core.py", False), ("pkg/testing_utils.py", False),
     ("pkg/distinfo.py", False), ("pkg/egg.py", False), ("pkg/pycache.py", False), ("test.py", True),
     ("tests.py", True), ("app/tests.py", True), ("pkg/testing.py", False), ("contest.py", False)],
)  # fmt: skip
def test_is_test_path(path, is_test):
    assert is_test_path(path) is is_test


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("pytest.ini", "[pytest]\npython_files = check_*.py suites/*.py\n"),
        (".pytest.ini", "[pytest]\npython_files = check_*.py suites/*.py\n"),
        ("pyproject.toml", '[tool.pytest.ini_options]\npython_files = ["check_*.py", "suites/*.py"]\n'),
        ("pyproject.toml", '[tool.pytest.ini_options]\npython_files = "check_*.py suites/*.py"\n'),
        ("tox.ini", "[tox]\nenvlist = py311\n\n[pytest]\npython_files = check_*.py suites/*.py\n"),
        ("setup.cfg", "[metadata]\nname = x\n\n[tool:pytest]\npython_files =\n    check_*.py\n    suites/*.py\n"),
    ],
)
def test_the_repositorys_own_python_files_make_test_files(tmp_path, name, config):
    """What the runner collects is a test file wherever the suite's pytest configuration says so."""
    tree = _tree(tmp_path, {name: config, "check_parse.py": "", "pkg/check_io.py": "", "suites/io.py": "",
                            "pkg/core.py": "", "pkg/suites/x.py.txt": "", "test.py": ""})  # fmt: skip
    assert python_files_of(tree) == ("check_*.py", "suites/*.py")
    assert files_of_tests(tree) == ["check_parse.py", "pkg/check_io.py", "suites/io.py", "test.py"]


def test_the_first_pytest_config_decides_and_broken_ones_are_passed_over(tmp_path):
    """pytest reads one file: a pytest.ini (even without its section) hides setup.cfg's globs; an unparsable
    pyproject.toml is passed over; another tool's sections are not pytest's."""
    cfg = "[tool:pytest]\npython_files = check_*.py\n"
    assert python_files_of(_tree(tmp_path / "a", {"pytest.ini": "", "setup.cfg": cfg})) == ()
    assert python_files_of(_tree(tmp_path / "b", {"pyproject.toml": "[tool.pytest", "setup.cfg": cfg})) == (
        "check_*.py",
    )
    assert python_files_of(_tree(tmp_path / "c", {"tox.ini": "[testenv]\npython_files = x.py\n"})) == ()


def _new_file(path: str, line: str) -> str:
    return f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+{line}\n"


@pytest.mark.parametrize(
    "path",
    [".pytest.ini", "pytest.toml", ".pytest.toml", "sub/.pytest.ini", "usercustomize.py", "pkg/sitecustomize.py",
     "evil.pth", "calc_tools-0.dist-info/entry_points.txt", "calc_tools-0.dist-info/METADATA",
     "calc_tools.egg-info/entry_points.txt", "calc_tools.egg-info", "lib/calc_tools-0.dist-info/RECORD",
     "calc-0.egg/EGG-INFO/entry_points.txt", "pkg/__pycache__/core.cpython-311.pyc", "pkg/__pycache__/notes.txt",
     "pkg/core.pyc", "pkg/core.pyo"],
)  # fmt: skip
def test_files_that_change_import_or_collection_time_behaviour_are_dropped_from_a_diff(path):
    """An entry-point plugin in packaging metadata, a .pth file, stale bytecode, an interpreter customization module
    or a pytest ini file pytest would read: none survives the grader's filter (``is_test_path``)."""
    assert is_test_path(path)
    code, dropped = filter_patch(_new_file(path, "x") + _new_file("pkg/fix.py", "x = 1"), lambda p: not is_test_path(p))
    assert dropped == [path] and "pkg/fix.py" in code and path not in code


def test_gold_patch_replays_as_tool_calls(tmp_path):
    before = _tree(tmp_path / "b", {"m.py": "def f(x):\n    return x < 1\n", "end.py": "a = 1"})
    after = _tree(tmp_path / "a", {"m.py": "def f(x):\n    return x <= 1\n", "end.py": "a = 2", "n.py": "new\n"})
    actions = patch_to_actions(diff_trees(before, after))
    tools = sorted(a.tool for a in actions)
    assert tools == ["create", "replace", "replace"]
    for action in actions:  # play them on a copy: the result must equal the after tree
        path = tmp_path / "b" / action.args["path"]
        if action.tool == "create":
            path.write_text(action.args["content"])
        else:
            text = path.read_text()
            assert text.count(action.args["old"]) == 1
            path.write_text(text.replace(action.args["old"], action.args["new"]))
    assert diff_trees(tmp_path / "b", after) == ""


def test_grading_restores_the_tests_a_repositorys_own_python_files_names(tmp_path):
    """A repository whose tests are check_*.py: the policy's edit of one is dropped like an edit of test_x.py,
    judged by the pristine tree's configuration (which the policy cannot change: pytest.ini is dropped too)."""
    base = tmp_path / "base"
    (base / "pkg").mkdir(parents=True)
    (base / "pytest.ini").write_text("[pytest]\npython_files = check_*.py\n")
    (base / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (base / "check_calc.py").write_text("from pkg.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    after = tmp_path / "after"
    shutil.copytree(base, after)
    (after / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (after / "check_calc.py").write_text("def test_add():\n    assert True\n")
    (after / "pytest.ini").write_text("[pytest]\npython_files = nothing_*.py\n")
    graded, control = tmp_path / "graded", tmp_path / "control"
    for tree in (graded, control):
        shutil.copytree(base, tree)
        apply_patch(tree, diff_trees(base, after))

    kept, dropped = restore_tests(base, graded, python_files_of(base))
    assert (kept, dropped) == (["pkg/calc.py"], ["check_calc.py", "pytest.ini"])
    assert "return a + b" in (graded / "pkg/calc.py").read_text()
    assert (graded / "check_calc.py").read_text() == (base / "check_calc.py").read_text()
    assert "check_calc.py" in restore_tests(base, control)[0]  # the control: by name alone it would have stayed


def test_grading_reads_what_changed_from_the_trees_not_from_the_diffs_text(tmp_path):
    """Names git quotes (non-ASCII), names with spaces, and a ---/+++ block with no ``diff --git`` line: what the
    diff changed is what ``git apply`` did to the tree, and each test path among it is put back."""
    base = tmp_path / "base"
    (base / "pkg").mkdir(parents=True)
    (base / "pkg" / "core.py").write_text("x = 1\n")
    after = tmp_path / "after"
    shutil.copytree(base, after)
    (after / "pkg" / "core.py").write_text("x = 2\n")
    (after / "pkg" / "pl\u00fcgin.py").write_text("y = 1\n")
    (after / "release notes.md").write_text("x is 2\n")
    diff = diff_trees(base, after)
    assert '"b/pkg/pl\\303\\274gin.py"' in diff  # git's quoting, left as git apply reads it
    assert sorted(touched_paths(diff)) == ["pkg/core.py", "pkg/pl\u00fcgin.py", "release notes.md"]
    diff += "--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1 @@\n+import os\n"  # a block without a git header
    diff += 'diff --git "a/tests/conftest.py" "b/tests/conftest.py"\nnew file mode 100644\n--- /dev/null\n'
    diff += '+++ "b/tests/conftest.py"\n@@ -0,0 +1 @@\n+import os\n'
    tree = tmp_path / "tree"
    shutil.copytree(base, tree)
    apply_patch(tree, diff)

    kept, dropped = restore_tests(base, tree)
    assert kept == ["pkg/core.py", "pkg/pl\u00fcgin.py", "release notes.md"]
    assert dropped == ["conftest.py", "tests/conftest.py"]
    assert not (tree / "conftest.py").exists() and not (tree / "tests").joinpath("conftest.py").exists()


def test_a_configuration_file_that_is_a_symlink_is_not_followed(tmp_path):
    """The repository's files are hostile: a pytest.ini pointing at a host file is not read, a real one is."""
    outside = tmp_path / "host.ini"
    outside.write_text("[pytest]\npython_files = check_*.py\n")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pytest.ini").symlink_to(outside)
    assert python_files_of(tree) == ()
    (tree / "pytest.ini").unlink()
    (tree / "pytest.ini").write_text(outside.read_text())
    assert python_files_of(tree) == ("check_*.py",)


def test_a_hand_written_quoted_name_with_a_stray_backslash_is_read_not_a_crash():
    """git never writes ``\\z`` in a quoted name; a hand-written diff may, and reading its paths must not raise."""
    diff = 'diff --git "a/x\\zz.py" "b/x\\zz.py"\n--- "a/x\\zz.py"\n+++ "b/x\\zz.py"\n'
    assert touched_paths(diff) == ["x\\zz.py"]
