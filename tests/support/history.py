"""A git repository grown one commit at a time in a test's directory, with fixed dates and no host config."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

CORE = """def parse_items(text):
    return [item.strip() for item in text.split(",")]
"""
TESTS = """from pkg import core


def test_parse_items():
    assert core.parse_items("a, b") == ["a", "b"]
"""


def git_env(repo: Path, date: str) -> dict[str, str]:
    """No host config, a fixed date: the same history, and the same shas, on every machine."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
    }


def git(repo: Path, *args: str, stdin: str | None = None, date: str = "2024-01-01T00:00:00+00:00") -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo, input=stdin, capture_output=True, text=True, env=git_env(repo, date), check=True,
    )  # fmt: skip
    return done.stdout.strip()


class History:
    """A repository grown one commit at a time; ``step(n)`` adds function ``stepN`` and its test."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.core, self.tests = CORE, TESTS
        self.sha: dict[str, str] = {}
        git(repo, "init", "-q", "-b", "main")

    def commit(self, name: str, message: str, files: dict[str, str], year: int = 2024) -> None:
        for rel, text in files.items():
            (self.repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.repo / rel).write_text(text)
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-q", "-F", "-", stdin=message, date=f"{year}-03-{len(self.sha) + 1:02d}T10:00:00Z")
        self.sha[name] = git(self.repo, "rev-parse", "HEAD")

    def step(self, n: int, extra_code: str = "") -> dict[str, str]:
        self.core += f"\n\n{extra_code}def step{n}(x):\n    return x + {n}\n"
        self.tests += f"\n\ndef test_step{n}():\n    assert core.step{n}(1) == {n + 1}\n"
        return {"pkg/core.py": self.core, "tests/test_core.py": self.tests}
