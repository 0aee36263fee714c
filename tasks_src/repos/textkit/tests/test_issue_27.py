from textkit import ngrams, words


def test_bigrams_include_the_last_pair() -> None:
    assert ngrams(["a", "b", "c"], 2) == [("a", "b"), ("b", "c")]


def test_ngrams_as_long_as_the_input() -> None:
    assert ngrams("abc", 3) == [("a", "b", "c")]
    assert len(ngrams(words("to be or not to be"), 1)) == 6
