"""Which commits of a history are fixes with tests, judged as the runner and a person would judge them.

Small repositories are built in a temporary directory, one commit per shape: test modules the runner collects
outside pytest's default names (a root-level ``test.py``, the suite's own ``python_files``); commits that fix
nothing (bots, reverts, releases, chores, comment-only and typo changes) beside real fixes that look like them;
subject-only messages, kept only where a linked issue says what was wrong or the user asks for them.
"""

from __future__ import annotations

import json

import pytest
from support.cli_runner import invoke
from support.history import History

from trialforge.errors import RepoError
from trialforge.store.objstore import open_store
from trialforge.tasks.ingest.extras import split_extras
from trialforge.tasks.ingest.gitlog import ingest_git_history
from trialforge.tasks.ingest.nonfix import check_message
from trialforge.tasks.ingest.objects import Commit
from trialforge.tasks.snapshots import SnapshotStore

pytestmark = pytest.mark.pure

LIB = "def total(values):\n    return sum(values)\n"
FLAT_TEST = "import unittest\n\nimport lib\n\n\nclass Total(unittest.TestCase):\n    def test_total(self):\n" \
            "        self.assertEqual(lib.total([1, 2]), 3)\n"  # fmt: skip
WHY = "\n\ntotal() of an empty list raised TypeError in the accumulator instead of returning zero like sum()."


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory) -> SnapshotStore:
    root = tmp_path_factory.mktemp("snapshots")
    return SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")


def _mine(history: History, snapshots: SnapshotStore, **knobs) -> tuple[list[str], dict[str, str]]:
    """(names of the kept commits, commit name -> reason of each dropped one)."""
    tasks, funnel = ingest_git_history(history.repo, snapshots, repo_name="lib", **knobs)
    names = {sha: name for name, sha in history.sha.items()}
    kept = [names[split_extras(t.source.ref)[0]] for t in tasks]
    return kept, {names[d["ref"].split("@")[1]]: d["reason"] for d in funnel.details}


def test_test_modules_are_what_the_runner_collects_not_only_pytests_default_names(tmp_path, snapshots):
    h = History(tmp_path)
    h.commit("root", "Initial import", {"lib.py": LIB, "test.py": FLAT_TEST, "setup.cfg": "[metadata]\nname = lib\n"})
    fixed = LIB.replace("sum(values)", "sum(values, 0)")
    h.commit("root_test_py", "Empty totals are zero" + WHY, {"lib.py": fixed, "test.py": FLAT_TEST + "\n# empty\n"})
    h.commit(
        "own_python_files",
        "Collect the checks directory\n\nThe suite names its modules check_*.py; pytest must be told.",
        {"setup.cfg": "[metadata]\nname = lib\n\n[tool:pytest]\npython_files = check_*.py\n",
         "checks/check_lib.py": "import lib\n\n\ndef check_total():\n    assert lib.total([]) == 0\n"},
    )  # fmt: skip
    h.commit(
        "fix_checked_by_own_module",
        "Negative totals are clamped" + WHY,
        {"lib.py": fixed + "\n\ndef clamp(x):\n    return max(x, 0)\n",
         "checks/check_lib.py": "import lib\n\n\ndef check_clamp():\n    assert lib.clamp(-1) == 0\n"},
    )  # fmt: skip
    kept, dropped = _mine(h, snapshots)
    assert kept == ["root_test_py", "fix_checked_by_own_module"]
    assert dropped == {"root": "root_commit", "own_python_files": "no_code_changes"}


SCRIPT = "#!/usr/bin/env python\nimport sys\n\nprint(sys.argv)\n"
CHECK = '\n\ndef check(value):\n    if value is None:\n        raise ValueError("bad valeu")\n    return value\n' \
        "\n\ndef twice(value):\n    return vaule * 2\n"  # fmt: skip

NON_FIXES = {
    "pre_commit_ci": (
        "bot_commit",
        "[pre-commit.ci] auto fixes from pre-commit.com hooks\n\nfor more information, see https://pre-commit.ci",
    ),
    "dependabot": ("bot_commit", "Bump pytest from 7.0.1 to 7.4.0\n\nBumps pytest from 7.0.1 to 7.4.0."),
    "renovate": ("bot_commit", "chore(deps): update dependency ruff to v0.4.2"),
    "revert": ("revert_commit", 'Revert "Clamp negative totals"\n\nThis reverts commit 0123456789abcdef0123456789.'),
    "rebased_merge": ("merge_commit", "Merge branch 'main' into feature\n\nConflicts in lib.py resolved by hand."),
    "release": ("release_commit", "Release 2.1.0"),
    "bump": ("release_commit", "Bump version to 2.2"),
    "tag": ("release_commit", "v2.3.0\n\nSee CHANGES for what is new in this release."),
    "chore": ("housekeeping_commit", "chore: tidy the helpers\n\nMoves code around while the tests follow it."),
    "docs": ("housekeeping_commit", "docs(api): describe total() and its edge cases for the reference"),
    "ci": ("housekeeping_commit", "ci: run the suite on 3.12\n\nThe matrix missed the newest interpreter."),
    "dev_chores": ("housekeeping_commit", "Dev chores (#2226)\n\n* Migrate to pyproject.toml\n* Migrate to ruff"),
    "project_files": ("housekeeping_commit", "update project files\n\n* update pre-commit hooks\n* update dev deps"),
    "style": ("style_commit", "style: wrap long lines\n\nThe linter asks for 79 columns in every module."),
    "black": ("style_commit", "Run black on the whole tree\n\nOne style for every module, tests included."),
}


def test_commits_that_fix_nothing_are_dropped_each_with_its_reason(tmp_path, snapshots):
    h = History(tmp_path)
    h.commit("root", "Initial import", {"pkg/__init__.py": "", "scripts/render": SCRIPT, **h.step(0)})
    for n, (name, (_, message)) in enumerate(NON_FIXES.items(), start=1):
        h.commit(name, message, h.step(n))  # each changes code and its test: only the message tells
    base = len(NON_FIXES) + 1
    documented = h.step(base)
    h.commit("real_fix", "step shifts by the wrong amount" + WHY, documented)
    code = documented["pkg/core.py"]
    h.commit(
        "comment_only",
        "Explain step's offset\n\nA reader could not tell why the offset is added before the call returns.",
        {"pkg/core.py": code.replace("def step1(x):", "def step1(x):\n    # the offset is the step's number\n    "
                                     '"""Shift by one."""', 1), "tests/test_core.py": h.tests + "\n# see step1\n"},
    )  # fmt: skip
    h.commit(  # jmespath's "Fix typos": comments of a module and of a Python script named without .py
        "comment_in_script",
        "Fix typos\n\n* `evalution` -> `evaluation`\n* `predictible` -> `predictable`",
        {"scripts/render": SCRIPT.replace("\n", "\n# render the evaluation\n", 1),
         "pkg/core.py": code + "\n# predictable\n", "tests/test_core.py": h.tests + "\n# evaluation\n"},
    )  # fmt: skip
    code = h.core = (h.repo / "pkg/core.py").read_text() + CHECK
    h.commit("add_check", "check() accepts None" + WHY, {"pkg/core.py": code, "tests/test_core.py": h.tests + "\n"})
    h.commit(
        "typo_in_text",
        "Fix typo in the error message\n\nThe message said 'valeu' where it meant 'value', confusing users.",
        {"pkg/core.py": code.replace("bad valeu", "bad value"), "tests/test_core.py": h.tests + "\n\n"},
    )
    h.commit(
        "typo_that_broke_code",
        "Fix typo that broke twice()\n\ntwice() named a misspelt variable, so every call raised NameError.",
        {"pkg/core.py": code.replace("bad valeu", "bad value").replace("vaule", "value"),
         "tests/test_core.py": h.tests + "\n\n\ndef test_twice():\n    assert core.twice(2) == 4\n"},
    )  # fmt: skip
    h.commit(
        "whitespace_fix",
        "Fix whitespace handling in parse_items\n\nItems separated by tabs kept the tab: strip() was never applied.",
        h.step(base + 1),
    )
    kept, dropped = _mine(h, snapshots)
    assert kept == ["real_fix", "add_check", "typo_that_broke_code", "whitespace_fix"]
    assert dropped == {
        "root": "root_commit",
        **{name: reason for name, (reason, _) in NON_FIXES.items()},
        "comment_only": "no_behaviour_change",
        "comment_in_script": "no_behaviour_change",
        "typo_in_text": "typo_fix",
    }


@pytest.mark.parametrize(
    "subject",
    ["Fix whitespace handling in split", "Release the lock after 2 reads", "Revert to the old parser on errors",
     "Format dates as ISO 8601", "Document-level merge of settings", "Merge adjacent ranges",
     "Update the cache on writes", "Chores list keeps its order", "Bump the counter once per call",
     "Fix the version 2 header parser"],
)  # fmt: skip
def test_fixes_whose_subjects_merely_contain_a_housekeeping_word_are_kept(subject):
    check_message(Commit(sha="0" * 40, parents=(), author_date=None, message=subject + WHY))  # type: ignore[arg-type]


def test_a_message_rule_says_what_the_commit_is():
    with pytest.raises(RepoError) as caught:
        check_message(Commit(sha="1" * 40, parents=(), author_date=None, message="v1.4.0"))  # type: ignore[arg-type]
    assert caught.value.reason == "release_commit"
    assert str(caught.value) == f"commit {'1' * 40} is a release or version bump: 'v1.4.0'"


SUBJECT = "Return zero for the total of an empty list of values"  # ten words: only the body rule drops it


@pytest.fixture(scope="module")
def subjects(tmp_path_factory) -> History:
    h = History(tmp_path_factory.mktemp("subjects"))
    h.commit("root", "Initial import", {"pkg/__init__.py": "", **h.step(0)})
    h.commit("subject_only", SUBJECT, h.step(1))
    h.commit("subject_with_issue", "Handle negative steps (#12)", h.step(2))
    h.commit("with_body", "step3 is off by one" + WHY, h.step(3))
    return h


def test_a_subject_only_commit_is_dropped_unless_a_linked_issue_states_the_problem(subjects, snapshots, tmp_path):
    issues = tmp_path / "issues.jsonl"
    body = "Stepping by a negative amount returns the input unchanged; it should shift the value down."
    issues.write_text(json.dumps({"number": 12, "title": "Negative steps ignored", "body": body}) + "\n")
    kept, dropped = _mine(subjects, snapshots, issues=issues)
    assert kept == ["subject_with_issue", "with_body"]
    assert dropped == {"root": "root_commit", "subject_only": "subject_only"}
    assert _mine(subjects, snapshots)[1]["subject_with_issue"] == "subject_only"  # the issue's text is not at hand


def test_keep_subject_only_keeps_them_from_the_command_line(subjects, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"run:\n  store: file://{tmp_path / 'store'}\n  out_dir: {tmp_path / 'out'}\n")
    argv = ["ingest", "gitlog", "--repo", f"lib={subjects.repo}", "--params", str(params)]
    dropped, kept = invoke(*argv), invoke(*argv, "--keep-subject-only")
    assert dropped.exit_code == kept.exit_code == 0, dropped.output + kept.output
    assert dropped.stdout.splitlines()[0] == "ingest.gitlog: kept 1 of 4"
    assert "  dropped 2 subject_only" in dropped.stdout.splitlines()
    assert kept.stdout.splitlines()[0] == "ingest.gitlog: kept 2 of 4"  # SUBJECT's ten words are kept
    assert "  dropped 1 statement_too_short" in kept.stdout.splitlines()  # "Handle negative steps (#12)": 4 words
