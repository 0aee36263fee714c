"""A repository's own pytest configuration, read as pytest finds it, from files given as text (a tree or a commit).

Only parsed (configparser, tomllib), never run: the files are the repository's, so hostile.
"""

from __future__ import annotations

import configparser
import fnmatch
import shlex
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

# The files pytest takes its configuration from, in its order, with the section each must hold to count
# (pyproject.toml: ``[tool.pytest.ini_options]``, or pytest 9's native ``[tool.pytest]``).
PYTEST_CONFIGS = (("pytest.ini", "pytest"), (".pytest.ini", "pytest"), ("pyproject.toml", ""), ("tox.ini", "pytest"),
                  ("setup.cfg", "tool:pytest"))  # fmt: skip

CONFIG_CAP = 1 << 20  # a configuration file's bytes read: pytest's own are a few kilobytes
Reader = Callable[[str], str | None]  # a root-level file's text, None when the tree has no such file


def pytest_option(read: Reader, option: str) -> tuple[str, str | list[str]] | None:
    """(file, value) of ``option`` in the file pytest takes its configuration from; None when it sets none.

    The first file holding a pytest section decides, as in pytest: a later file's value is never read.
    An unparsable file is passed over (pytest would stop; the run reports that, not this reader).
    """
    for name, section in PYTEST_CONFIGS:
        text = read(name)
        if text is None:
            continue
        table = _toml_table(text) if name == "pyproject.toml" else _ini_section(text, section)
        if table is None and name.endswith("pytest.ini"):
            table = {}  # pytest.ini decides even without a [pytest] section
        if table is None:
            continue
        value = table.get(option)
        return None if value is None else (name, value)
    return None


def python_files(read: Reader) -> tuple[str, ...]:
    """The repository's own ``python_files`` globs (``check_*.py``, ``test.py``...); () when it sets none."""
    found = pytest_option(read, "python_files")
    if found is None:
        return ()
    value = found[1]
    return tuple(map(str, value)) if isinstance(value, list) else _words(value)


def python_files_of(tree: Path) -> tuple[str, ...]:
    """:func:`python_files` of a directory."""
    return python_files(lambda name: text_of(tree / name))


def collects(path: str, patterns: Sequence[str]) -> bool:
    """Whether one of pytest's ``python_files`` globs matches ``path``: a glob without a ``/`` is matched against
    the file's name, one with a ``/`` against the path's end (pytest's ``fnmatch_ex``)."""
    pure = PurePosixPath(path)
    if pure.suffix != ".py":
        return False
    return any(
        fnmatch.fnmatchcase(pure.name, glob) if "/" not in glob else fnmatch.fnmatchcase(f"/{path}", f"*/{glob}")
        for glob in patterns
    )


def _words(value: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(value))  # an ini "args" option, as pytest splits it
    except ValueError:
        return tuple(value.split())


def _toml_table(text: str) -> dict | None:
    try:
        options = tomllib.loads(text).get("tool", {}).get("pytest", {})
    except tomllib.TOMLDecodeError:
        return None
    table = options.get("ini_options", options) if isinstance(options, dict) else None
    return table if isinstance(table, dict) and table else None


def _ini_section(text: str, section: str) -> dict | None:
    cfg = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        cfg.read_string(text)
    except configparser.Error:
        return None
    return dict(cfg[section]) if cfg.has_section(section) else None


def text_of(path: Path) -> str | None:
    """A regular file's text (its first ``CONFIG_CAP`` bytes), None when it is not one: a symlink is not followed
    (the tree's files are the repository's: one could point anywhere on the host)."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        with path.open("rb") as handle:
            return handle.read(CONFIG_CAP).decode(errors="replace")
    except OSError:
        return None
