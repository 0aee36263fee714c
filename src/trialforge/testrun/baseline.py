"""The repository's baseline: the in-process evidence its own trees give, and what a graded run shows beyond it.

A library may walk the collector, read other threads' frames, install a trace function or change pytest's hooks in
its own untouched code; the detectors cannot tell that from tampering, and the verdict that matters is the host's
(docs/verification.md, "By construction"). So validation records what the pre-fix and the fixed trees show (nothing
in them is a policy's) and grading zeroes only evidence beyond it. Kept exact, never widened to a kind: a baseline of
``framework_patched:_pytest.runner.call_and_report`` excuses that function replaced, nothing else of pytest's.

Not every piece of evidence can be a baseline: what makes a run unreadable (the stream, the exit status), what names
a test (grading renames graded tests, so it could never match), and the canaries (the one check of a wholly
in-process verdict) reject the task with a reason of their own (``rejection``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# The report cannot be read as the recorder wrote it: its stream, the process's exit, or pytest's own accounting.
UNREADABLE = (
    "report_stream_broken",
    "foreign_bytes_on_report_channel",
    "exited_0_without_report",
    "exit_status_mismatch:",
    "exit_code_contradicts_outcomes:",
    "stopped_before_max_failures:",
    "deselected_outside_collection",
)
# Evidence about one test, by its id: graded ids are renamed, so a baseline of one would never match again.
PER_TEST = (
    "test_item_patched:",
    "report_contradicts_run:",
    "test_reported_twice:",
    "report_changed_after_it_was_made:",
    "deselected_test_ran:",
    "skip_from_code_under_test:",
)
FORCED = "canary_passed:"  # a must-fail test passed: outcomes were forced (by the task's own data, here)
CANARY = "canary_"
FLAG = "baseline:"  # a graded run's evidence that the baseline explains: recorded with the verdict, never a zero


def rejection(evidence: Iterable[str]) -> str:
    """Why runs of the task's own trees with ``evidence`` cannot give a task ("" when it is all baseline).

    Forced outcomes are tampering whoever did it (a test patch's conftest, a gold patch); the rest is the
    environment's: the task would be graded blind or not at all.
    """
    found = list(dict.fromkeys(evidence))
    if any(e.startswith(FORCED) for e in found):
        return f"tampered: {', '.join(found)}"
    for key, kinds in (
        ("env_report_unreadable", UNREADABLE),
        ("env_tests_unreadable", PER_TEST),
        ("env_canaries_unreliable", (CANARY,)),
    ):
        if hits := [e for e in found if e.startswith(kinds)]:
            return f"{key}: the runs of the task's own trees show {', '.join(hits[:5])}"
    return ""


def beyond(evidence: Sequence[str], known: Iterable[str]) -> tuple[list[str], list[str]]:
    """``evidence`` split into what the baseline ``known`` does not explain, and what it does."""
    explained = set(known)
    return [e for e in evidence if e not in explained], [e for e in evidence if e in explained]
