import pytest

from textkit import ngrams, sentences, word_frequencies, words


def test_words_keep_inner_apostrophes() -> None:
    assert words("Don't stop—l'été, 2024!") == ["Don't", "stop", "l'été", "2024"]
    assert words("snake_case") == ["snake", "case"]


def test_sentences() -> None:
    assert sentences("Hi there. How are you?  Fine!") == ["Hi there.", "How are you?", "Fine!"]
    assert sentences('He said "stop." Then he left.') == ['He said "stop."', "Then he left."]
    assert sentences("   ") == []


def test_ngrams_edge_cases() -> None:
    assert ngrams(["a", "b"], 3) == []
    assert ngrams([], 1) == []
    with pytest.raises(ValueError):
        ngrams(["a"], 0)


def test_word_frequencies() -> None:
    text = "The cat and the hat. THE END"
    assert word_frequencies(text, top=2) == [("the", 3), ("cat", 1)]
    assert word_frequencies(text, stopwords=frozenset({"the", "and"}))[0] == ("cat", 1)
