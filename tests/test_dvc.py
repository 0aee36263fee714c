"""DVC for real: a pipeline reproduced in a fresh clone, rerun only where a parameter changed,
and its outputs pushed to an S3 remote (the moto server) and pulled back byte for byte.

The stages are small Python commands reading params.yaml, so the test measures DVC, not the
trialforge stages (whose imports alone take longer than this whole test on a loaded machine); the project's
own dvc.yaml is reproduced in tests/test_doors.py.
DVC's repository lock fails instead of waiting, so every dvc command here runs one at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml
from support.s3_server import create_bucket

pytestmark = [pytest.mark.services, pytest.mark.slow]

VENV_BIN = Path(sys.executable).parent
DVC = VENV_BIN / "dvc"

STAGES_PY = """\
import json, os, sys
from pathlib import Path

import yaml

stage = sys.argv[1]
params = yaml.safe_load(Path("params.yaml").read_text())
with open(os.environ["STAGE_LOG"], "a") as log:
    log.write(stage + "\\n")
if stage == "prepare":
    Path("data").mkdir(exist_ok=True)
    Path("data/numbers.json").write_text(json.dumps(list(range(params["prepare"]["count"]))))
elif stage == "train":
    numbers = json.loads(Path("data/numbers.json").read_text())
    Path("model").mkdir(exist_ok=True)
    Path("model/weights.json").write_text(json.dumps([n * params["train"]["factor"] for n in numbers]))
elif stage == "evaluate":
    weights = json.loads(Path("model/weights.json").read_text())
    Path("metrics.json").write_text(json.dumps({"total": sum(weights)}))
"""

DVC_YAML = {
    "stages": {
        "prepare": {
            "cmd": "python stages.py prepare",
            "deps": ["stages.py"],
            "params": ["prepare.count"],
            "outs": ["data/numbers.json"],
        },
        "train": {
            "cmd": "python stages.py train",
            "deps": ["stages.py", "data/numbers.json"],
            "params": ["train.factor"],
            "outs": ["model/weights.json"],
        },
        "evaluate": {
            "cmd": "python stages.py evaluate",
            "deps": ["stages.py", "model/weights.json"],
            "metrics": [{"metrics.json": {"cache": False}}],
        },
    }
}
PARAMS = {"prepare": {"count": 5000}, "train": {"factor": 2}}
CACHED_OUTS = ("data/numbers.json", "model/weights.json")


class Workspace:
    """Runs git and dvc in one directory, one command at a time, with the stage log beside it."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.log = root.parent / f"{root.name}.stages.log"
        self.env = env | {"STAGE_LOG": str(self.log)}

    def run(self, *cmd: str | Path) -> str:
        done = subprocess.run(
            [str(c) for c in cmd], cwd=self.root, env=self.env, capture_output=True, text=True, timeout=180, check=False
        )
        assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    def dvc(self, *args: str) -> str:
        return self.run(DVC, *args)

    def git(self, *args: str) -> str:
        return self.run("git", *args)

    def stages_run(self) -> list[str]:
        """Stages that ran since the last call (each stage appends its name when it runs)."""
        ran = self.log.read_text().split() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return ran

    def read(self, path: str) -> bytes:
        return (self.root / path).read_bytes()


@pytest.fixture
def isolated_env(tmp_path: Path) -> dict[str, str]:
    """No user or machine config for git, DVC or AWS (an empty HOME, no AWS_ variables: the remote's keys must
    come from DVC's own config); the venv's python first on PATH, since the stages import yaml."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DVC_", "GIT_"))}
    home = tmp_path / "home"
    home.mkdir()
    return env | {
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "HOME": str(home),
        "DVC_NO_ANALYTICS": "1",
        "DVC_SITE_CACHE_DIR": str(tmp_path / "dvc-site"),
        "DVC_GLOBAL_CONFIG_DIR": str(tmp_path / "dvc-global"),
        "DVC_SYSTEM_CONFIG_DIR": str(tmp_path / "dvc-system"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "trialforge-test",
        "GIT_AUTHOR_EMAIL": "test@trialforge.invalid",
        "GIT_COMMITTER_NAME": "trialforge-test",
        "GIT_COMMITTER_EMAIL": "test@trialforge.invalid",
    }


def test_dvc_reproduces_in_a_clone_reruns_only_changed_stages_and_round_trips_s3(
    tmp_path: Path, isolated_env: dict[str, str], s3_server: str
) -> None:
    origin = Workspace(tmp_path / "origin", isolated_env)
    origin.root.mkdir()
    (origin.root / "stages.py").write_text(STAGES_PY)
    (origin.root / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML, sort_keys=False))
    (origin.root / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    origin.git("init", "-q", "-b", "main")
    origin.dvc("init", "-q")
    origin.dvc("repro")
    assert origin.stages_run() == ["prepare", "train", "evaluate"]
    assert json.loads(origin.read("metrics.json")) == {"total": 2 * sum(range(5000))}
    origin.git("add", "-A")
    origin.git("commit", "-q", "-m", "pipeline")
    assert origin.git("status", "--porcelain") == ""  # dvc.lock and the .gitignore files are committed

    # A fresh clone has the pipeline, its lock and the git-tracked metrics, but no cached outputs and no cache:
    # repro rebuilds the missing outputs identically, and the stage whose inputs and outputs all match the lock
    # (evaluate: its metrics file came with git) does not run.
    clone = Workspace(tmp_path / "clone", isolated_env)
    origin.run("git", "clone", "-q", origin.root, clone.root)
    assert not (clone.root / "data/numbers.json").exists()
    clone.dvc("repro")
    assert clone.stages_run() == ["prepare", "train"]
    for path in (*CACHED_OUTS, "metrics.json", "dvc.lock"):
        assert clone.read(path) == origin.read(path), path

    # A parameter of the second stage changes: the first stage is skipped, the ones downstream rerun.
    params = yaml.safe_load(clone.read("params.yaml"))
    params["train"]["factor"] = 3
    (clone.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = clone.dvc("repro")
    assert clone.stages_run() == ["train", "evaluate"]
    assert "'prepare' didn't change" in out
    assert clone.read("data/numbers.json") == origin.read("data/numbers.json")
    assert json.loads(clone.read("metrics.json")) == {"total": 3 * sum(range(5000))}

    # An S3 remote on the moto server; the keys live only in the uncommitted config.local.
    bucket = create_bucket(s3_server)
    clone.dvc("remote", "add", "-d", "s3r", f"s3://{bucket}/dvc")
    clone.dvc("remote", "modify", "s3r", "endpointurl", s3_server)
    clone.dvc("remote", "modify", "--local", "s3r", "access_key_id", "testing")
    clone.dvc("remote", "modify", "--local", "s3r", "secret_access_key", "testing")
    assert "testing" not in clone.read(".dvc/config").decode()
    assert ".dvc/config.local" not in clone.git("status", "--porcelain", "--ignored=no")
    pushed = clone.dvc("push")
    assert "2 files pushed" in pushed, pushed
    objects = boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket=bucket, Prefix="dvc/")
    assert len(objects.get("Contents", [])) == 2

    # Lose the cache and the outputs, then pull them back from S3.
    expected = {path: clone.read(path) for path in CACHED_OUTS}
    shutil.rmtree(clone.root / ".dvc" / "cache")
    for path in CACHED_OUTS:
        (clone.root / path).unlink()
    clone.dvc("pull")
    assert {path: clone.read(path) for path in CACHED_OUTS} == expected
    assert clone.stages_run() == []
    clone.dvc("repro")
    assert clone.stages_run() == []  # the pulled outputs match dvc.lock: nothing is stale
