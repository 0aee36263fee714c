"""Edits of a Python file's text that keep every line at its number: how a graded test file is rewritten.

Code can see where it stands in its file: a warning's ``lineno``, ``co_firstlineno``, a traceback, ``inspect.getsource``
(typeguard asserts ``warning.lineno == test.__code__.co_firstlineno + 3``; its ``@typechecked`` re-reads the source
of the function it wraps). A file reprinted from its syntax tree moves lines (``ast.unparse`` puts a blank line before
a nested def, drops comments and docstrings), so a gold patch failed there. Here each edit replaces a span of the
original text with text of as many lines: what is removed leaves blank lines, what replaces a statement keeps the
code it runs on the lines it had, and every line no edit touches keeps its number and its columns.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

Position = tuple[int, int]  # (line from 1, column in characters)
_WHITESPACE = " \t\f"


def split_lines(text: str) -> list[str]:
    """Lines as Python's tokenizer counts them (``\\n``, ``\\r\\n`` or ``\\r``), each with its ending."""
    return io.StringIO(text, newline="").readlines()


class LineEdits:
    """Span replacements on one source text, applied bottom up; ``apply`` refuses overlapping spans."""

    def __init__(self, source: str) -> None:
        self.lines = split_lines(source)
        self.edits: list[tuple[Position, Position, str]] = []

    def strip_comments(self) -> None:
        """Drop every comment (and the blanks before it): a comment may spell an expected value."""
        for token in tokenize.generate_tokens(io.StringIO("".join(self.lines)).readline):
            if token.type == tokenize.COMMENT:
                (row, col), (_, end) = token.start, token.end
                line = self.lines[row - 1]
                self.lines[row - 1] = line[:col].rstrip(_WHITESPACE) + line[end:]

    def column(self, line: int, offset: int) -> int:
        """ast's column (UTF-8 bytes) as characters of ``line``."""
        return len(self.lines[line - 1].encode("utf-8")[:offset].decode("utf-8", errors="ignore"))

    def start(self, node: ast.AST) -> Position:
        return node.lineno, self.column(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> Position:
        line = node.end_lineno  # type: ignore[attr-defined]
        return line, self.column(line, node.end_col_offset)  # type: ignore[attr-defined]

    def text(self, node: ast.AST) -> str:
        """The node's source, exactly as the file has it (less comments, once stripped)."""
        (l1, c1), (l2, c2) = self.start(node), self.end(node)
        if l1 == l2:
            return self.lines[l1 - 1][c1:c2]
        return self.lines[l1 - 1][c1:] + "".join(self.lines[l1 : l2 - 1]) + self.lines[l2 - 1][:c2]

    def replace(self, start: Position, end: Position, text: str) -> None:
        self.edits.append((start, end, text))

    def replace_node(self, node: ast.AST, text: str, close: str = "") -> None:
        """``node``'s span becomes ``text`` + ``close``, padded with line breaks before ``close`` to as many lines
        (so ``text`` must leave a bracket open that ``close`` closes, when the node spans lines)."""
        start, end = self.start(node), self.end(node)
        self.replace(start, end, text + "\n" * (end[0] - start[0]) + close)

    def rebuild(self, node: ast.AST, pieces: list[str | ast.AST], close: str) -> None:
        """``node``'s span becomes ``pieces`` (text, or nodes copied verbatim on the line they start on) + ``close``,
        line breaks added inside the brackets the text opens, so the span keeps its number of lines."""
        line = node.lineno  # type: ignore[attr-defined]
        out: list[str] = []
        for piece in pieces:
            if isinstance(piece, str):
                out.append(piece)
                continue
            if piece.lineno > line:  # type: ignore[attr-defined]
                out.append("\n" * (piece.lineno - line))  # type: ignore[attr-defined]
            out.append(self.text(piece))
            line = piece.end_lineno  # type: ignore[attr-defined]
        end = self.end(node)
        out.append("\n" * max(0, end[0] - line) + close)
        self.replace(self.start(node), end, "".join(out))

    def insert(self, at: Position, text: str) -> None:
        self.replace(at, at, text)

    def remove(self, node: ast.stmt, first_line: int | None = None, placeholder: str = "") -> None:
        """Take the statement out (from ``first_line``: its decorators): blank lines where it stood, or
        ``placeholder`` (``pass``) where a body would be left empty or it shares its line with another statement."""
        (l1, c1), (l2, c2) = self.start(node), self.end(node)
        if first_line is not None:
            l1, c1 = first_line, 0
        before, after = self.lines[l1 - 1][:c1], self.lines[l2 - 1][c2:]
        if not before.strip(_WHITESPACE) and not after.strip():
            self.replace((l1, len(before) if placeholder else 0), (l2, c2), placeholder + "\n" * (l2 - l1))
        elif l1 == l2:
            self.replace((l1, c1), (l2, c2), placeholder or "pass")
        else:
            raise ValueError(f"line {l1}: a statement of several lines shares a line with another")

    def rename_function(self, node: ast.FunctionDef, name: str) -> None:
        line = self.lines[node.lineno - 1]
        found = re.compile(rf"def\s+({re.escape(node.name)})\b").match(line, self.column(node.lineno, node.col_offset))
        if found is None:
            raise ValueError(f"line {node.lineno}: no `def {node.name}` where the syntax tree has it")
        self.replace((node.lineno, found.start(1)), (node.lineno, found.end(1)), name)

    def blank(self, line: int) -> bool:
        return line <= len(self.lines) and not self.lines[line - 1].strip()

    def apply(self) -> str:
        """The edited text (each edit's span as in the original); ValueError when two spans overlap."""
        floor: Position | None = None
        for start, end, text in sorted(self.edits, key=lambda e: (e[0], e[1]), reverse=True):
            if floor is not None and end > floor:
                raise ValueError(f"line {start[0]}: overlapping edits")
            floor = start
            (l1, c1), (l2, c2) = start, end
            joined = self.lines[l1 - 1][:c1] + text + self.lines[l2 - 1][c2:]
            self.lines[l1 - 1 : l2] = split_lines(joined)
        self.edits = []
        return "".join(self.lines)
