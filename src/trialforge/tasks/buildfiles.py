"""Files a repository's install writes into its tree, which a tree from git lacks.

A placeholder version module where hatch-vcs or setuptools-scm would generate it (version 0.0.0: the tree carries
no tags), and a minimal ``NAME-0.0.0.dist-info`` beside the package for tests that read the distribution's
metadata. Why: docs/environments.md, "Files the install would write".
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?")  # PEP 508 names, short
PY_STUB = '__version__ = version = "0.0.0"\n__version_tuple__ = version_tuple = (0, 0, 0)\n'


def version_file(tool: Mapping[str, Any]) -> object:
    """The version module hatch-vcs or setuptools-scm is configured (pyproject's ``[tool]``) to write."""
    hatch = tool.get("hatch", {}).get("build", {}).get("hooks", {}).get("vcs", {}).get("version-file")
    scm = tool.get("setuptools_scm", {})
    return hatch or scm.get("version_file") or scm.get("write_to")


def write_build_files(tree: Path) -> list[str]:
    """What an editable install would add to ``tree``: its version module and its distribution's metadata."""
    pyproject = _pyproject(tree)
    written = [write_version_file(tree, pyproject.get("tool", {})), _write_dist_info(tree, pyproject.get("project"))]
    return [path for path in written if path]


def _pyproject(tree: Path) -> dict[str, Any]:
    try:
        return tomllib.loads((tree / "pyproject.toml").read_text(errors="replace"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _write_dist_info(tree: Path, project: object) -> str | None:
    name = project.get("name") if isinstance(project, dict) else None
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return None
    root = tree / "src" if (tree / "src").is_dir() and not (tree / "src").is_symlink() else tree
    info = root / f"{re.sub(r'[-_.]+', '_', name)}-0.0.0.dist-info"
    if info.exists() or info.is_symlink() or any(root.glob("*.dist-info")) or any(root.glob("*.egg-info")):
        return None
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.0\n")
    return info.relative_to(tree).as_posix()


def write_version_file(tree: Path, tool: Mapping[str, Any]) -> str | None:
    """Write the placeholder version module pyproject's ``tool`` names when the tree lacks it; its path, or None.

    Only inside the tree: a path that is absolute, climbs out, goes through a symbolic link or names a
    directory that does not exist is left alone (the tree is the repository's, not ours).
    """
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
