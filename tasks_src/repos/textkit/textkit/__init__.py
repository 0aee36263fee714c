"""textkit: small, dependency-free text utilities."""

from textkit.case import camel_case, constant_case, kebab_case, pascal_case, snake_case, split_words, title_case
from textkit.distance import closest, levenshtein, similarity
from textkit.slug import slugify, unique_slug
from textkit.template import TemplateError, placeholders, render
from textkit.tokens import ngrams, sentences, word_frequencies, words
from textkit.truncate import truncate, truncate_middle, truncate_words
from textkit.wrap import fill, indent, wrap

__version__ = "1.2.0"

__all__ = [
    "TemplateError",
    "camel_case",
    "closest",
    "constant_case",
    "fill",
    "indent",
    "kebab_case",
    "levenshtein",
    "ngrams",
    "pascal_case",
    "placeholders",
    "render",
    "sentences",
    "similarity",
    "slugify",
    "snake_case",
    "split_words",
    "title_case",
    "truncate",
    "truncate_middle",
    "truncate_words",
    "unique_slug",
    "word_frequencies",
    "words",
    "wrap",
]
