"""benchmarks/realrepos.py's corpus halves and judgments: what it reads and the columns it prints from them."""

from __future__ import annotations

from pathlib import Path

import pytest
from realrepos import (
    CORPUS,
    JUDGMENTS,
    Judgment,
    corpus_repos,
    goals,
    load_judgments,
    product_at_fault,
    real_fixes_accepted,
    tally,
    verdict,
)

pytestmark = pytest.mark.pure

CORPUS_TEXT = """
[[repo]]
name = "octo/seen"
held_out = false

[[repo]]
name = "octo/unseen"
held_out = true
"""


def judgment(task: str, reason: str, fault: str, real_fix: bool = True) -> Judgment:
    return Judgment(task=task, reason=reason, fault=fault, real_fix=real_fix, why="read")


def test_a_half_of_the_corpus_is_read_from_its_mirrors(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.toml"
    corpus.write_text(CORPUS_TEXT)
    for name in ("octo+seen", "octo+unseen"):
        (tmp_path / "mirrors" / name / "repo").mkdir(parents=True)
    assert corpus_repos("tuning", tmp_path / "mirrors", corpus) == {"seen": str(tmp_path / "mirrors/octo+seen/repo")}
    assert corpus_repos("held-out", tmp_path / "mirrors", corpus) == {
        "unseen": str(tmp_path / "mirrors/octo+unseen/repo")
    }
    (tmp_path / "mirrors" / "octo+unseen" / "repo").rmdir()
    with pytest.raises(SystemExit, match=r"--corpus held-out: no mirror at .*octo\+unseen/repo"):
        corpus_repos("held-out", tmp_path / "mirrors", corpus)


def test_the_committed_corpus_has_two_halves_of_twelve(tmp_path: Path) -> None:
    for half in ("tuning", "held-out"):
        with pytest.raises(SystemExit) as raised:
            corpus_repos(half, tmp_path, CORPUS)  # no mirrors here: the message names all twelve
        assert str(raised.value).count(f"{tmp_path}/") == 12


def test_the_committed_judgments_parse() -> None:
    judged = load_judgments(JUDGMENTS)
    assert all(j.why.strip() for j in judged.values())


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[[judgment]]\ntask = "a-1"\nreason = "validate/x"\nfault = "maybe"\nreal_fix = true\nwhy = "w"', "fault"),
        ('[[judgment]]\ntask = "a-1"\nreason = "validate/x"\nfault = "product"\nwhy = "w"', "real_fix"),
        ("[[judgment]\n", "Expected"),
    ],
)
def test_a_malformed_judgments_file_is_a_one_line_error(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "judgments.toml"
    path.write_text(text)
    with pytest.raises(SystemExit, match=error) as raised:
        load_judgments(path)
    assert "\n" not in str(raised.value)


def test_rejections_are_counted_by_their_judged_fault_and_an_unread_one_is_unjudged() -> None:
    judgments = {
        ("a-1", "validate/tampered"): judgment("a-1", "validate/tampered", "product"),
        ("a-2", "validate/no_fail_to_pass"): judgment("a-2", "validate/no_fail_to_pass", "commit", real_fix=False),
        ("a-3", "validate/no_fail_to_pass"): judgment("a-3", "validate/no_fail_to_pass", "commit", real_fix=False),
    }
    rejections = [
        ("a-1", "validate/tampered", "detail"),
        ("a-2", "validate/no_fail_to_pass", "detail"),
        ("a-3", "validate/fix_breaks_tests", "detail"),  # judged under another reason: a new case to read
    ]
    t = tally(rejections, judgments)
    assert t.faults == {"product": 1, "commit": 1, "unjudged": 1}
    assert t.not_fixes == 1
    assert product_at_fault(t) == "1/3 (33%), 1 unjudged"
    # 10 instances, 1 not a real fix: 6 accepted of 9 real fixes
    assert real_fixes_accepted(6, 10, t) == "6/9 (67%)"
    measured = goals(6, 10, t)
    assert "real fixes accepted 6/9 (67%), goal >= 70%: NOT met" in measured
    assert "product at fault 1/3 of rejections (33%), goal <= 10%: NOT met" in measured
    assert "1 rejections unjudged" in measured
    assert verdict(judgments["a-2", "validate/no_fail_to_pass"]) == "commit, not a real fix: read"
    assert verdict(None) == "unjudged"


def test_no_rejection_meets_both_goals() -> None:
    t = tally([], {})
    assert product_at_fault(t) == "-"
    assert goals(4, 4, t).splitlines() == [
        "real fixes accepted 4/4 (100%), goal >= 70%: met",
        "product at fault 0/0 of rejections (0%), goal <= 10%: met",
    ]
