"""Git history mining keeps only commits a person would accept as tasks, and says why it drops the rest.

One real repository is built in a temporary directory, one commit per shape: a subject-only commit,
trailers without a body, runner configuration as the only "test" change, docs/CI/packaging as the only
"code" change, commits linking issues of an issues file (closing keyword, squash-merge suffix through a
pull request, a mention, a number the file lacks, an issue too short to be a statement), a statement
naming the identifier the fix adds, a statement over the cap, and a tree whose ``python_requires`` no
image meets.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.history import CORE, TESTS, History

from trialforge.errors import RepoError
from trialforge.store.objstore import open_store
from trialforge.tasks.ingest.caps import IngestCaps
from trialforge.tasks.ingest.extras import split_extras
from trialforge.tasks.ingest.fixes import is_runner_config, is_support_file, require_code_and_tests
from trialforge.tasks.ingest.gitlog import (
    GITLOG_CONFIDENCE,
    ISSUE_CONFIDENCE,
    MENTION_CONFIDENCE,
    IngestFunnel,
    ingest_git_history,
    issue_refs,
    message_body,
)
from trialforge.tasks.ingest.objects import Commit
from trialforge.tasks.snapshots import SnapshotStore

pytestmark = pytest.mark.pure

SETUP = 'from setuptools import setup\n\nsetup(name="tool", version="{version}"{extra})\n'
URL = "https://github.com/acme/tool"
ISSUES = [
    {
        "number": 3,
        "title": "parse_items crashes on None",
        "body": "Calling parse_items(None) raises AttributeError instead of returning an empty list.",
        "html_url": f"{URL}/issues/3",
    },
    {"number": 4, "title": "Negative steps", "body": "Stepping by a negative amount should shift values down too."},
    {
        "number": 5,
        "title": "total of nothing",
        "body": "Asking for the total of an empty sequence fails; it should be zero like the built-in sum.",
        "html_url": f"{URL}/issues/5",
    },
    {
        "number": 7,
        "title": "Return 0 for empty totals",
        "body": "Makes the helper return 0.\n\nFixes #5",
        "html_url": f"{URL}/pull/7",
        "pull_request": {"url": "https://api.github.com/repos/acme/tool/pulls/7"},
    },
    {"number": 8, "title": "Bug", "body": "", "html_url": f"{URL}/issues/8"},
]


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> History:
    h = History(tmp_path_factory.mktemp("tool"))
    root = {
        "pkg/__init__.py": "",
        "pkg/core.py": CORE,
        "tests/test_core.py": TESTS,
        "setup.py": SETUP.format(version="1.0", extra=""),
        "setup.cfg": "[metadata]\nname = tool\n",
        "README.md": "# tool\n",
    }
    h.commit("root", "Initial import", root)
    h.commit("subject_only", "Minor cleanups.", h.step(1))
    h.commit(
        "message",
        "step2 shifts by the wrong amount\n\nstep2(1) returned 1 instead of 3: the offset was never added.",
        h.step(2),
    )
    h.commit("trailers", "Tweak step3\n\nSigned-off-by: T <t@t>\nCo-authored-by: U <u@u>", h.step(3))
    h.step(4)
    h.commit(
        "runner_config",
        "Add step4 and run tests verbosely\n\nThe suite output was too terse to see which step helper failed.",
        {"pkg/core.py": h.core, "setup.cfg": "[metadata]\nname = tool\n\n[tool:pytest]\naddopts = -v\n",
         "tox.ini": "[tox]\nenvlist = py311\n"},
    )  # fmt: skip
    h.commit(
        "docs_ci_packaging",
        "More tests and documentation\n\nDocuments the helpers, runs CI on pull requests and tests the old helpers.",
        {
            "tests/test_core.py": h.tests,  # the test for step4 comes here, with no code change
            "README.md": "# tool\n\nParses items.\n",
            "docs/index.rst": "tool\n====\n",
            ".github/workflows/ci.yml": "on: pull_request\n",
            "setup.py": SETUP.format(version="1.1", extra=""),
            "CHANGELOG": "1.1: more tests\n",
        },
    )
    h.commit("squash", "Return 0 for empty totals (#7)", h.step(6))
    h.commit("closing", "Guard parse_items against None, fixes #3", h.step(7))
    h.commit("mention", "Shift by negative amounts too\n\nSee GH-4.", h.step(8))
    h.commit("unknown_issue", "Quick fix for #99", h.step(9))
    h.commit("short_issue", "Fixes #8", h.step(10))
    h.commit(
        "leak",
        "Coerce None in step11\n\nNone inputs now go through _coerce_none, so step11 stops crashing on them.",
        h.step(11, extra_code="def _coerce_none(value):\n    return 0 if value is None else value\n\n\n"),
    )
    h.commit(
        "names_tested_api",
        "Add step12\n\nCallers need step12 to shift values by twelve; until now there was no helper for it.",
        h.step(12),
    )
    h.commit("long", "Handle long input in step13\n\n" + "Long explanation. " * 200, h.step(13))
    h.commit(
        "old_python",
        "Declare the supported Python",
        {"setup.py": SETUP.format(version="1.1", extra=", python_requires='<3.6'")},
        year=2018,
    )
    h.commit(
        "needs_old_python",
        "step14 overflows on big inputs\n\nstep14 of a very large number raised instead of returning the sum.",
        h.step(14),
        year=2018,
    )
    return h


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory) -> SnapshotStore:
    root = tmp_path_factory.mktemp("snapshots")
    return SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")


@pytest.fixture(scope="module")
def issues_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("issues") / "issues.jsonl"
    lines = [json.dumps(issue) for issue in ISSUES]
    lines.insert(2, '{"number": 6, "title": "truncated')
    lines.append(json.dumps({"number": 9, "title": "huge", "body": "z" * 5_000}))
    path.write_text("\n".join(lines) + "\n")
    return path


CAPS = IngestCaps(max_statement_chars=2_000, max_record_bytes=4_096)


@pytest.fixture(scope="module")
def mined(history, snapshots, issues_file):
    return ingest_git_history(history.repo, snapshots, repo_name="tool", issues=issues_file, caps=CAPS)


def _by_commit(history: History, funnel: IngestFunnel) -> dict[str, tuple[str, str]]:
    """commit name -> (reason, detail) for every dropped commit."""
    names = {sha: name for name, sha in history.sha.items()}
    return {
        names[d["ref"].split("@")[1]]: (d["reason"], d["detail"])
        for d in funnel.details
        if d["ref"].startswith("tool@")
    }


def test_only_commits_a_person_would_accept_are_kept(history, mined):
    tasks, funnel = mined
    kept = {split_extras(t.source.ref)[0]: t for t in tasks}
    names = {sha: name for name, sha in history.sha.items()}
    assert [names[sha] for sha in kept] == ["message", "squash", "closing", "mention", "names_tested_api"]
    assert {name: reason for name, (reason, _) in _by_commit(history, funnel).items()} == {
        "root": "root_commit",
        "subject_only": "subject_only",
        "trailers": "subject_only",
        "runner_config": "no_test_changes",
        "docs_ci_packaging": "no_code_changes",
        "unknown_issue": "subject_only",
        "short_issue": "statement_too_short",
        "leak": "statement_leaks_fix",
        "long": "oversize_statement",
        "old_python": "no_test_changes",
        "needs_old_python": "no_python_for_era",
    }
    assert (funnel.kept, funnel.seen) == (5, len(history.sha) + 2)  # + the issues file's two bad lines


def test_a_message_statement_is_title_and_body_at_low_confidence(history, mined):
    task = mined[0][0]
    assert task.problem_statement == (
        "step2 shifts by the wrong amount\n\nstep2(1) returned 1 instead of 3: the offset was never added."
    )
    assert task.source.link_confidence == GITLOG_CONFIDENCE
    assert split_extras(task.source.ref)[1] == {"base_commit": history.sha["subject_only"]}


def test_a_linked_issue_is_the_statement_and_the_link_is_recorded(history, mined):
    tasks, funnel = mined
    by_name = {name: t for t in tasks for name, sha in history.sha.items() if split_extras(t.source.ref)[0] == sha}
    issue = {i["number"]: i for i in ISSUES}

    def text(number: int) -> str:
        return f"{issue[number]['title']}\n\n{issue[number]['body']}"

    squash, closing, mention = by_name["squash"], by_name["closing"], by_name["mention"]
    assert squash.problem_statement == text(5)  # "(#7)" is a pull request: the issue it closes is the statement
    assert closing.problem_statement == text(3)
    assert mention.problem_statement == text(4)
    assert [t.source.link_confidence for t in (squash, closing, mention)] == [
        ISSUE_CONFIDENCE,
        ISSUE_CONFIDENCE,
        MENTION_CONFIDENCE,
    ]
    extras = split_extras(squash.source.ref)[1]
    assert extras["issue"] == f"{URL}/issues/5"
    assert extras["link_rule"] == "squash-merge suffix #7 -> pull request closes #5"
    links = {link["task_id"]: link for link in funnel.links}
    assert links[closing.task_id] == {
        "task_id": closing.task_id,
        "ticket": f"{URL}/issues/3",
        "fix": history.sha["closing"],
        "confidence": ISSUE_CONFIDENCE,
        "rule": "closing keyword #3",
        "used": True,
    }
    assert links[mention.task_id]["ticket"] == "#4"  # an issue record without an html_url


def test_each_drop_says_why_in_terms_a_person_can_act_on(history, mined):
    drops = _by_commit(history, mined[1])
    assert "only the subject 'Minor cleanups.'" in drops["subject_only"][1]
    assert "only the subject 'Tweak step3'" in drops["trailers"][1]  # trailers are not a body
    assert "it names #99, which the issues file does not hold" in drops["unknown_issue"][1]
    assert "closing keyword #8" in drops["short_issue"][1] and "is 1 words, fewer than 8" in drops["short_issue"][1]
    assert "test-runner configuration on the test side (setup.cfg, tox.ini)" in drops["runner_config"][1]
    assert drops["docs_ci_packaging"][1].endswith(
        "only docs/CI/packaging files changed (.github/workflows/ci.yml, CHANGELOG, README.md, docs/index.rst "
        "and 1 more)"
    )
    assert "names '_coerce_none', which the fix adds" in drops["leak"][1]
    assert (
        "problem statement is 3,6" in drops["long"][1]
        and "> 2,000 (sources.caps.max_statement_chars)" in drops["long"][1]
    )
    era = drops["needs_old_python"][1]
    assert "requires-python '<3.6' in setup.py allows none of the Pythons images exist for: 3.9" in era
    assert era.startswith(f"base {history.sha['old_python'][:12]}: ")


def test_bad_lines_of_the_issues_file_are_reported_with_their_line(mined):
    funnel = mined[1]
    issue_drops = {d["ref"]: d["reason"] for d in funnel.details if d["ref"].startswith("issues.jsonl")}
    assert issue_drops == {"issues.jsonl:3": "issues/malformed_json", "issues.jsonl:7": "issues/oversize_record"}


def test_without_an_issues_file_linked_commits_fall_back_to_their_message(history, snapshots):
    tasks, funnel = ingest_git_history(history.repo, snapshots, repo_name="tool", caps=CAPS)
    drops = _by_commit(history, funnel)
    names = {sha: name for name, sha in history.sha.items()}
    assert [names[split_extras(t.source.ref)[0]] for t in tasks] == ["message", "names_tested_api"]
    assert all(t.source.link_confidence == GITLOG_CONFIDENCE for t in tasks)
    assert (drops["squash"][0], drops["mention"][0]) == ("subject_only", "statement_too_short")
    assert "it names #7, which the issues file does not hold" in drops["squash"][1]
    assert "'Shift by negative amounts too\\n\\nSee GH-4.'; it names #4, which the issues" in drops["mention"][1]


def test_an_override_python_admits_a_tree_whose_requires_python_no_image_meets(history, snapshots, issues_file):
    tasks, funnel = ingest_git_history(
        history.repo, snapshots, repo_name="tool", issues=issues_file, caps=CAPS,
        env_overrides={"tool": {"python": "3.11"}},
    )  # fmt: skip
    assert history.sha["needs_old_python"] in {split_extras(t.source.ref)[0] for t in tasks}
    assert "no_python_for_era" not in funnel.dropped


def test_the_base_state_of_a_kept_task_is_the_parent_tree(history, mined, snapshots):
    task = next(t for t in mined[0] if split_extras(t.source.ref)[0] == history.sha["closing"])
    base = snapshots.materialize(task.snapshot)
    assert "def step6" in (base / "pkg" / "core.py").read_text()
    assert "def step7" not in (base / "pkg" / "core.py").read_text()
    assert "def step7" in task.gold_patch and "test_step7" in task.test_patch


# --- the rules, one at a time --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "refs"),
    [
        ("Fix parser, fixes #12", [(12, "closing keyword", ISSUE_CONFIDENCE)]),
        ("Closes GH-12", [(12, "closing keyword", ISSUE_CONFIDENCE)]),
        ("Handle empty input (#31)", [(31, "squash-merge suffix", ISSUE_CONFIDENCE)]),
        ("See #4 and GH-5", [(4, "mention", MENTION_CONFIDENCE), (5, "mention", MENTION_CONFIDENCE)]),
        (f"Fix crash\n\nReported in {URL}/issues/9", [(9, "mention", MENTION_CONFIDENCE)]),
        (
            "Fix #3 properly (#40)\n\nSee #3.",
            [(3, "closing keyword", ISSUE_CONFIDENCE), (40, "squash-merge suffix", ISSUE_CONFIDENCE)],
        ),
        ("Escape &#39; and other/repo#5 and issue#6", []),
    ],
)
def test_issue_references_in_commit_messages(message, refs):
    assert [(r.number, r.rule, r.confidence) for r in issue_refs(message)] == refs


def test_message_body_drops_trailer_paragraphs_only():
    def commit(message: str) -> Commit:
        return Commit(sha="0" * 40, parents=(), author_date=None, message=message)  # type: ignore[arg-type]

    assert message_body(commit("Subject\n\nSigned-off-by: A <a@b>\n\n(cherry picked from commit abc123)")) == ""
    assert message_body(commit("Subject\n\nWhy it broke.\n\nReviewed-by: A <a@b>")) == "Why it broke."
    assert message_body(commit("Subject\n\nNote: the cache was stale.")) == "Note: the cache was stale."


@pytest.mark.parametrize(
    ("paths", "reason"),
    [
        (["pkg/core.py", "setup.cfg", "tox.ini", "pytest.ini", "pyproject.toml"], "no_test_changes"),
        (["pkg/core.py", "tests/test_core.py"], None),
        (["pkg/core.py", "tests/conftest.py"], None),  # conftest.py is test code
        (["pkg/core.py", "setup.cfg", "tests/test_core.py"], None),
        (["tests/test_core.py", "README.md", "docs/api.rst", ".github/workflows/ci.yml"], "no_code_changes"),
        (["tests/test_core.py", "setup.py", "MANIFEST.in", "requirements-dev.txt", ".travis.yml"], "no_code_changes"),
        (["tests/test_core.py", "README.md", "pkg/core.py"], None),
        (["tests/test_core.py"], "no_code_changes"),
        (["pkg/core.py"], "no_test_changes"),
    ],
)
def test_what_counts_as_a_test_change_and_a_code_change(paths, reason):
    if reason is None:
        require_code_and_tests(paths, "change")
        return
    with pytest.raises(RepoError) as caught:
        require_code_and_tests(paths, "change")
    assert caught.value.reason == reason


def test_runner_config_and_support_files_are_told_from_code():
    assert all(map(is_runner_config, ["setup.cfg", "sub/tox.ini", "pytest.ini", "pyproject.toml", "x.pth"]))
    assert not any(map(is_runner_config, ["tests/conftest.py", "tests/test_a.py", "tests/data.json"]))
    support = ["README.rst", "docs/conf.py", ".github/workflows/ci.yml", "setup.py", "CHANGES", "LICENSE", "Makefile"]
    assert all(map(is_support_file, support))
    assert not any(
        map(is_support_file, ["pkg/core.py", "src/pkg/__init__.py", "pkg/setup_helpers.py", "pkg/data.json"])
    )
