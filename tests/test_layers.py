"""The layer contract of pyproject.toml ([tool.importlinter]) holds, and catches an import that runs up a layer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(src: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}  # before the editable install: this tree's trialforge is analysed
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_layers_hold() -> None:
    done = lint_imports(ROOT / "src")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "src" / "trialforge", tmp_path / "trialforge")
    sandbox_base = tmp_path / "trialforge" / "sandbox" / "base.py"
    sandbox_base.write_text(sandbox_base.read_text() + "\nfrom trialforge.loop import records  # noqa\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert "trialforge.sandbox is not allowed to import trialforge.loop" in done.stdout
