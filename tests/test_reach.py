"""Whether a task's fix lies in the repair policy's action space (one line, one single-token edit), and why not."""

from __future__ import annotations

from pathlib import Path

import pytest

from trialforge.rollout.reach import Reach, family_reach, fix_in_reach
from trialforge.tasks.mutations import mutants_of_source
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.schema import Source, Task

pytestmark = pytest.mark.pure

NOT_AN_EDIT = "the one-line fix is neither a one-token edit nor an unread name put back"

SPAN = "def between(x, lo, hi):\n    x = float(x)\n    if x < lo:\n        return False\n    return x <= hi\n"


def diff(path: str, hunk: str) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n{hunk}"


FLIP = diff(
    "pkg/span.py",
    "@@ -3,2 +3,2 @@ def between(x, lo, hi):\n         return False\n-    return x < hi\n+    return x <= hi\n",
)
DROPPED = diff(
    "pkg/span.py",
    "@@ -1,2 +1,4 @@\n def between(x, lo, hi):\n+    if x < lo:\n+        return False\n     return x <= hi\n",
)
EXTRA = diff("pkg/span.py", "@@ -1,3 +1,2 @@\n def between(x, lo, hi):\n-    x = abs(x)\n     if x < lo:\n")
THREE = diff(
    "pkg/span.py",
    "@@ -1,3 +1,3 @@\n-def between(x, lo, hi):\n-    if x < lo:\n-        return False\n"
    "+def between(x, low, hi):\n+    if x < low:\n+        return None\n",
)
REWRITE = diff("pkg/span.py", "@@ -4 +4 @@\n-    return x < hi\n+    return lo <= x <= hi\n")
DOCS = diff("README.md", "@@ -1 +1 @@\n-Spans exclude their end.\n+Spans include their end.\n")
TEST_ONLY = diff("tests/test_span.py", "@@ -1 +1 @@\n-    assert between(5, 1, 5)\n+    assert between(5, 1, 6)\n")


def task(gold_patch: str, kind: str = "synthetic", ref: str = "flip_compare:pkg/span.py:4") -> Task:
    return Task(
        task_id="t",
        source=Source(kind=kind, ref=ref),
        repo="r",
        problem_statement="between() excludes its upper bound",
        gold_patch=gold_patch,
        test_patch=TEST_ONLY,
    )


def test_a_flipped_comparison_is_in_reach() -> None:
    assert fix_in_reach(task(FLIP)) == Reach(True, "")
    assert fix_in_reach(task(FLIP + TEST_ONLY)).reachable  # the tests the fix brings along do not count
    trailing = FLIP.replace("+    return x <= hi\n", "+    return x <= hi   \n")
    assert fix_in_reach(task(trailing)).reachable  # trailing whitespace is ignored
    # The policy's negation leaves the parentheses: the same statement, so the same fix.
    negated = diff("m.py", "@@ -2 +2 @@\n-    if not (x < lo):\n+    if x < lo:\n")
    assert fix_in_reach(task(negated)).reachable


def test_a_name_put_back_is_in_reach() -> None:
    returned = diff("m.py", "@@ -3 +3 @@\n-    return None\n+    return found\n")
    passed = diff("m.py", "@@ -3 +3 @@\n-    out.extend(wrap(words, n))\n+    out.extend(wrap(words, n, strict))\n")
    assert fix_in_reach(task(returned)).reachable and fix_in_reach(task(passed)).reachable
    two_names = diff("m.py", "@@ -3 +3 @@\n-    return None\n+    return found or default\n")
    assert fix_in_reach(task(two_names)).reason == NOT_AN_EDIT


def test_each_kind_of_fix_out_of_reach_says_why() -> None:
    reasons = {name: fix_in_reach(task(patch)) for name, patch in [
        ("dropped", DROPPED), ("extra", EXTRA), ("three", THREE), ("rewrite", REWRITE), ("docs", DOCS),
        ("tests", TEST_ONLY), ("two files", FLIP + diff("pkg/other.py", "@@ -1 +1 @@\n-a = 1\n+a = 2\n")),
    ]}  # fmt: skip
    assert not any(reach.reachable for reach in reasons.values())
    assert reasons["dropped"].reason == (
        "the fix adds lines (a deleted statement or branch); the policy only rewrites a line"
    )
    assert reasons["extra"].reason == "the fix removes lines"
    assert reasons["three"].reason == "the fix changes 3 lines; the policy rewrites one"
    assert reasons["rewrite"].reason == NOT_AN_EDIT
    assert reasons["docs"].reason == reasons["tests"].reason == "the fix touches no Python file"
    assert reasons["two files"].reason == "the fix changes 2 files; the policy edits one"


def test_lines_that_look_like_file_headers_inside_a_hunk_are_changed_lines() -> None:
    # A removed line "-- x" reads "--- x" in the diff: still a line of the hunk, not the next file's header.
    patch = diff("m.py", "@@ -1,2 +1,2 @@\n--- x\n+-- y\n a = 1\n")
    assert fix_in_reach(task(patch)).reason == NOT_AN_EDIT


def test_families_tally_reach_and_reasons() -> None:
    assert task(FLIP).family() == "flip_compare"
    assert task(FLIP, kind="github", ref="octo/span#12").family() == "ticket:github"
    tasks = [task(FLIP), task(FLIP), task(REWRITE), task(DROPPED, ref="drop_branch:pkg/span.py:2"),
             task(DROPPED, kind="github", ref="octo/span#12")]  # fmt: skip
    assert family_reach(tasks) == {
        "drop_branch": {"tasks": 1, "reachable": 0, "unreachable_reasons": {
            "the fix adds lines (a deleted statement or branch); the policy only rewrites a line": 1}},
        "flip_compare": {"tasks": 3, "reachable": 2, "unreachable_reasons": {
            NOT_AN_EDIT: 1}},
        "ticket:github": {"tasks": 1, "reachable": 0, "unreachable_reasons": {
            "the fix adds lines (a deleted statement or branch); the policy only rewrites a line": 1}},
    }  # fmt: skip


def test_synthesized_gold_patches_of_flips_are_in_reach_and_of_dropped_statements_not(tmp_path: Path) -> None:
    """Gold patches made as synthesis makes them: the mutant's tree diffed against the original."""
    seen = {}
    for mutant in mutants_of_source("pkg/span.py", SPAN, ["flip_compare", "drop_statement"]):
        mutated, original = tmp_path / mutant.digest / "a", tmp_path / mutant.digest / "b"
        for tree, text in ((mutated, mutant.apply(SPAN)), (original, SPAN)):
            (tree / "pkg").mkdir(parents=True)
            (tree / "pkg" / "span.py").write_text(text)
        made = task(diff_trees(mutated, original), ref=f"{mutant.family}:{mutant.path}:{mutant.line}")
        seen.setdefault(made.family(), set()).add(fix_in_reach(made).reachable)
    assert seen == {"flip_compare": {True}, "drop_statement": {False}}


def test_a_miscounted_hunk_ends_at_the_next_file() -> None:
    short = FLIP.replace("@@ -3,2 +3,2 @@", "@@ -3,5 +3,5 @@")  # hand-written: counts more lines than it holds
    assert fix_in_reach(task(short + diff("pkg/other.py", "@@ -1 +1 @@\n-a = 1\n+a = 2\n"))).reason == (
        "the fix changes 2 files; the policy edits one"
    )
    assert fix_in_reach(task(short + TEST_ONLY)).reachable
