"""Where a task's statement came from, part by part, and what its fail-to-pass tests require that it never states.

A leaf module (pydantic only), like ``quality_record``: the task schema holds the record, validation writes it
(``tasks.observed``, ``tasks.underspecified``), the quality gate reads it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# author: the text the task was ingested with (a commit message, an issue); observed: what validation's runs before
# the fix showed (``tasks.observed``), never the fix's code nor a value the host judges
PartSource = Literal["author", "observed"]


class StatementPart(BaseModel):
    source: PartSource
    start: int  # ``problem_statement[start:end]``
    end: int


class StatementRecord(BaseModel):
    parts: list[StatementPart] = Field(default_factory=list)
    # what a fail-to-pass test requires that the statement neither names nor shows: exception types it expects
    # raised, string literals it compares against that the fix introduces (an agent could only guess them)
    missing_exceptions: list[str] = Field(default_factory=list)
    missing_literals: list[str] = Field(default_factory=list)

    @property
    def underspecified(self) -> bool:
        return bool(self.missing_exceptions or self.missing_literals)

    def author_text(self, statement: str) -> str:
        """The author's part of ``statement``: what a second validation starts from again."""
        return "".join(statement[p.start : p.end] for p in self.parts if p.source == "author")
