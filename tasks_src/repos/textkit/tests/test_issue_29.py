from textkit import similarity


def test_similarity_of_two_empty_strings() -> None:
    assert similarity("", "") == 1.0


def test_ranking_candidates_that_include_an_empty_string() -> None:
    candidates = ["", "a", "ab"]
    assert max(candidates, key=lambda candidate: similarity("", candidate)) == ""
