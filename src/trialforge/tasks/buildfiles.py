"""Files a repository's build backend writes into its tree, which a tree from git lacks.

hatch-vcs (``[tool.hatch.build.hooks.vcs] version-file``) and setuptools-scm (``[tool.setuptools_scm]
version_file`` / ``write_to``) generate the package's version module from git tags at build time; it is
ignored by git, so the tree of a commit has none and a package that imports it does not import
(jazzband/prettytable, python-humanize/humanize). Ingestion writes a placeholder where it belongs, as a
checkout after ``pip install -e .`` would have it (version 0.0.0: the tree carries no tags).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

PY_STUB = '__version__ = version = "0.0.0"\n__version_tuple__ = version_tuple = (0, 0, 0)\n'


def version_file(tool: Mapping[str, Any]) -> object:
    """The version module hatch-vcs or setuptools-scm is configured (pyproject's ``[tool]``) to write."""
    hatch = tool.get("hatch", {}).get("build", {}).get("hooks", {}).get("vcs", {}).get("version-file")
    scm = tool.get("setuptools_scm", {})
    return hatch or scm.get("version_file") or scm.get("write_to")


def write_version_file(tree: Path) -> str | None:
    """Write the placeholder version module ``tree``'s pyproject names when the tree lacks it; its path, or None.

    Only inside the tree: a path that is absolute, climbs out, goes through a symbolic link or names a
    directory that does not exist is left alone (the tree is the repository's, not ours).
    """
    try:
        tool = tomllib.loads((tree / "pyproject.toml").read_text(errors="replace")).get("tool", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    rel = version_file(tool)
    if not isinstance(rel, str) or not rel.strip():
        return None
    rel = rel.strip()
    parts = PurePosixPath(rel).parts
    path = tree.joinpath(*parts)
    if PurePosixPath(rel).is_absolute() or ".." in parts or path.exists() or path.is_symlink():
        return None
    if not path.parent.is_dir() or not path.parent.resolve().is_relative_to(tree.resolve()):
        return None
    path.write_text(PY_STUB if rel.endswith(".py") else "0.0.0\n")
    return rel
