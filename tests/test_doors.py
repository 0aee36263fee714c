"""The README walked as a newcomer walks it: each door it and docs/ print, run as printed, from a fresh clone.

The clone is the checkout's files (tracked and not ignored) in a new git repository, with `.venv` linking the
virtualenv `make setup` built (the one running these tests), and a small params.yaml: three of the bundled
tickets, no synthesis, one validation run, two wrong fixes per task in the quality gate, one iteration of two
episodes per group. Every command runs in bash after the README's set-up line, `source .venv/bin/activate`,
with the virtualenv off PATH before it: a command that needs anything else fails here as it would for a user.

The first tests hold dvc.yaml and params.yaml to ``trialforge.stages.STAGES`` (no subprocess: they run in
every suite); the others start real processes (dvc, the CLI, Prefect's server and a worker) and are ``slow``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import REPO_ROOT
from pydantic import BaseModel
from support.cli_runner import invoke
from support.prefect_server import PrefectServer
from support.processes import stop_group

from trialforge.config import Params, load_params
from trialforge.errors import ConfigError
from trialforge.rollout.policies import patch_to_actions
from trialforge.sandbox.images import cache_root
from trialforge.stages import NAMES, STAGES
from trialforge.tasks.taskset import read_tasks

VENV = Path(sys.prefix)  # the virtualenv that `make setup` built, running these tests
SMALL = {
    "sources.tickets": "tasks_src/tickets/three.jsonl",
    "sources.synthesize": 0,
    "validate.runs": 1,
    "quality.max_mutants": 2,
    "rollout.group_size": 2,
    "rollout.eval_group_size": 1,
    "train.iterations": 1,
}
TOKEN = "t" * 32


# --- dvc.yaml and params.yaml against the stages -------------------------------------------------------------


def _dvc_stages() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]


def _paths(entries: list[Any]) -> set[str]:
    """The paths of a dvc.yaml list whose entries are a path or ``{path: {options}}``."""
    return {e if isinstance(e, str) else next(iter(e)) for e in entries}


@pytest.mark.pure
def test_dvc_yaml_runs_each_stage_on_what_it_reads_writes_and_depends_on():
    out = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["run"]["out_dir"]
    declared = _dvc_stages()
    assert list(declared) == list(NAMES)
    for stage in STAGES:
        dvc = declared[stage.name]
        assert dvc["cmd"] == f"trialforge stage {stage.name}"
        assert _paths(dvc["deps"]) == set(stage.deps) | {f"{out}/{p}" for p in stage.reads}, stage.name
        written = _paths(dvc.get("outs", [])) | _paths(dvc.get("metrics", []))
        assert written == {f"{out}/{p}" for p in stage.writes}, stage.name
        assert dvc.get("params", []) == list(stage.params), stage.name
        for dep in stage.deps:  # a moved module or source is a stage DVC would never rerun for
            assert (REPO_ROOT / dep).exists(), f"{stage.name} depends on {dep}, which does not exist"


@pytest.mark.pure
def test_params_yaml_writes_out_every_knob_and_every_param_a_stage_names():
    written = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    missing = _missing(Params(), written, "")
    assert not missing, f"params.yaml lacks {missing}: write each out with its default"
    for stage in STAGES:
        for key in stage.params:
            node: Any = written
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"stage {stage.name}: {key} is not in params.yaml"
                node = node[part]


def _missing(model: BaseModel, written: dict[str, Any], prefix: str) -> list[str]:
    """The fields of ``model`` (and of the sections in it) that ``written`` lacks, as dotted keys."""
    missing = []
    for name, field in type(model).model_fields.items():
        key = field.alias or name
        if key not in written:
            missing.append(prefix + key)
        elif isinstance(getattr(model, name), BaseModel) and isinstance(written[key], dict):
            missing += _missing(getattr(model, name), written[key], f"{prefix}{key}.")
    return missing


# --- the clone, and its shell --------------------------------------------------------------------------------


@dataclass
class Clone:
    root: Path
    env: dict[str, str]

    def sh(self, script: str, timeout: float = 600, env: dict[str, str] | None = None) -> str:
        """``script`` in bash after the README's set-up line; its output (stdout, then stderr) once it exits 0."""
        done = subprocess.run(
            ["bash", "-c", f"set -e\nsource .venv/bin/activate\n{script}"],
            cwd=self.root,
            env=self.env | (env or {}),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        said = f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        assert done.returncode == 0, f"`{script}` exited {done.returncode}:\n{said}"
        return done.stdout + done.stderr

    @contextlib.contextmanager
    def started(self, script: str, log: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
        """``script`` in the background while the block runs (its output in ``log``), then stopped (SIGTERM)."""
        with (self.root / log).open("w") as out:
            process = subprocess.Popen(
                ["bash", "-c", f"set -e\nsource .venv/bin/activate\nexec {script}"],
                cwd=self.root,
                env=self.env | (env or {}),
                stdout=subprocess.PIPE,
                stderr=out,
                text=True,
                start_new_session=True,
            )
        try:
            yield process
        finally:
            stop_group(process, timeout=60)

    def set_params(self, changes: dict[str, Any]) -> None:
        """Edit params.yaml as a user would (a dotted key per change)."""
        path = self.root / "params.yaml"
        params = yaml.safe_load(path.read_text())
        for dotted, value in changes.items():
            *parents, leaf = dotted.split(".")
            node = params
            for part in parents:
                node = node[part]
            node[leaf] = value
        path.write_text(yaml.safe_dump(params, sort_keys=False))

    def json(self, path: str) -> Any:
        return json.loads((self.root / path).read_text())


@pytest.fixture(scope="module")
def clone(tmp_path_factory, state_dir) -> Clone:
    root = tmp_path_factory.mktemp("newcomer") / "trialforge"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (REPO_ROOT / name).is_file():  # a file deleted but not yet committed is listed too
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, root / name, follow_symlinks=False)
    (root / ".venv").symlink_to(VENV)
    tickets = (REPO_ROOT / "tasks_src" / "tickets" / "github_issues.jsonl").read_text().splitlines()
    (root / SMALL["sources.tickets"]).write_text("\n".join(tickets[:3]) + "\n")
    on_path = [p for p in os.environ["PATH"].split(os.pathsep) if Path(p).resolve() != (VENV / "bin").resolve()]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PREFECT_API_", "DVC_", "GIT_"))}
    env |= {
        "PATH": os.pathsep.join(on_path),
        "HOME": str(tmp_path_factory.mktemp("home")),  # no user config for git, dvc, prefect
        "TRIALFORGE_CACHE": str(cache_root()),  # the machine's images, wherever HOME is
        "PREFECT_HOME": str(tmp_path_factory.mktemp("prefect-home")),
        "DVC_NO_ANALYTICS": "1",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "newcomer",
        "GIT_AUTHOR_EMAIL": "newcomer@trialforge.invalid",
        "GIT_COMMITTER_NAME": "newcomer",
        "GIT_COMMITTER_EMAIL": "newcomer@trialforge.invalid",
        "COLUMNS": "200",  # rich's tables and bars in one line each, as a terminal shows them
    }
    made = Clone(root, env)
    made.sh("git init -q -b main && git add -A && git commit -q -m 'a fresh clone'")
    made.set_params(SMALL)
    return made


@pytest.fixture(scope="module")
def reproduced(clone: Clone) -> str:
    """`dvc repro` once: every stage of dvc.yaml, in the clone, from nothing."""
    return clone.sh("dvc repro")


# --- dvc ------------------------------------------------------------------------------------------------------


@pytest.mark.sandbox
@pytest.mark.slow
def test_dvc_repro_runs_every_stage_then_nothing_then_only_the_stages_of_a_changed_param(clone, reproduced):
    ran = [line.split("'")[1] for line in reproduced.splitlines() if line.startswith("Running stage '")]
    assert ran == list(NAMES)
    for name in ("ingest", "images", "validate", "decontaminate", "quality"):  # what `trialforge run` shows
        assert f"\n{name}: kept " in reproduced, name  # the stage's line
        funnel = clone.json(f"out/funnel/{name}.json")
        assert funnel["stage"] == name and f"every drop: out/funnel/{name}.json" in reproduced  # its funnel
    for bar in ("validate", "quality gate", "rollout iteration 0 round 0"):  # their progress, one bar each
        assert re.search(rf"^  {bar} +━+ \d+/\d+", reproduced, re.MULTILINE), bar
    assert "\ntrain 0: " in reproduced
    metrics = clone.json("out/metrics.json")
    assert metrics["task_set_version"] and (clone.root / "out" / "report.html").exists()

    again = clone.sh("dvc repro")
    assert "Running stage" not in again and "Data and pipelines are up to date." in again

    clone.set_params({"observe.prices.cpu_hour": 0.5})  # read by the report alone
    priced = clone.sh("dvc repro")
    assert [line for line in priced.splitlines() if line.startswith("Running stage")] == ["Running stage 'report':"]
    repriced = clone.json("out/metrics.json")
    assert metrics["cost"]["overall"]["money"] == 0 < repriced["cost"]["overall"]["money"]
    assert repriced["run_id"] == metrics["run_id"]  # the same run, priced anew

    shown = clone.sh("dvc metrics show && dvc plots show")
    assert "out/metrics.json" in shown and (clone.root / "dvc_plots" / "index.html").exists()


# --- the command table ----------------------------------------------------------------------------------------


@pytest.mark.sandbox
@pytest.mark.services  # `trialforge validate` runs a flow on Prefect's ephemeral server
@pytest.mark.slow
def test_a_task_file_is_ingested_then_curated_into_the_task_set_with_its_funnel(clone, reproduced):
    ingested = clone.sh("trialforge ingest github tasks_src/tickets/three.jsonl --repos tasks_src/repos")
    written = "out/tasks/ingested-github.parquet"
    assert ingested.strip().splitlines()[-1].endswith(f"curate them: trialforge validate {written}")
    curated = clone.sh(f"trialforge validate {written}")
    for name in ("images", "validate", "decontaminate", "quality"):
        assert f"\n{name}: kept " in curated and clone.json(f"out/funnel/{name}.json")["stage"] == name
    assert re.search(r"^  validate +━+ \d+/\d+", curated, re.MULTILINE) and "\ntask set: " in curated
    published = read_tasks(clone.root / "out" / "tasks" / "taskset.parquet")
    assert f"{len(published)} tasks published as " in curated
    assert {t.task_id for t in published} <= {t.task_id for t in read_tasks(clone.root / written)}


@pytest.mark.sandbox
@pytest.mark.services  # `trialforge run` runs a flow on Prefect's ephemeral server
@pytest.mark.slow
def test_the_cli_commands_of_the_readme_run_as_printed(clone, reproduced):
    first = clone.json("out/train/run.json")["run_id"]  # dvc's
    shutil.rmtree(clone.root / "out" / "funnel")
    run = clone.sh("trialforge run")
    second = clone.json("out/metrics.json")["run_id"]
    assert second != first and "\nquality: kept " in run and "\nrollout 0: " in run and "Learning health" in run
    for name in ("ingest", "images", "validate", "decontaminate", "quality"):  # the funnels, as dvc leaves them
        assert clone.json(f"out/funnel/{name}.json")["stage"] == name

    assert clone.sh(f"trialforge report {first}").strip().endswith(f"out/report-{first}.html")
    assert (clone.root / "out" / f"report-{first}.html").stat().st_size > 0
    compared = clone.sh(f"trialforge compare {first} {second}")
    assert first in compared and second in compared
    for fmt in ("verl", "trl"):
        exported = clone.sh(f"trialforge export {fmt} newcomer-{fmt}")
        assert " episodes -> " in exported and not exported.startswith("0 ")

    # README, "Reading the data": its Python, on this clone's store
    readme = (clone.root / "README.md").read_text()
    snippet = readme.split("## Reading the data", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    snippet = snippet.replace("/path/to/.trialforge/store", str(clone.root / ".trialforge" / "store"))
    read = clone.sh(f"python - <<'EOF'\n{snippet}print(len(episodes), set(episodes['policy']))\nEOF")
    assert read.strip().endswith("{'repair'}") and int(read.split()[0]) > 0

    spec = json.loads(clone.sh("trialforge image spec textkit=tasks_src/repos/textkit"))
    assert spec["python"] == "3.11" and spec["image_key"]
    base = json.loads(clone.sh("trialforge image build").splitlines()[0])
    built = clone.sh("trialforge image build --repo textkit=tasks_src/repos/textkit").splitlines()
    assert [json.loads(line)["name"] for line in built] == [base["name"], base["name"]]  # needs nothing more
    assert clone.sh("trialforge reap").startswith("removed")


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_serve_env_serves_the_curated_tasks_to_a_client_session(clone, reproduced):
    from trialforge.envserver.client import EnvClient

    task = read_tasks(clone.root / "out" / "tasks" / "taskset.parquet")[0]
    served = "trialforge serve env -S env_server.tasks=out/tasks/taskset.parquet -S env_server.port=0 --for 3600"
    with clone.started(served, "serve-env.log", env={"TRIALFORGE_ENV_TOKEN": TOKEN}) as server:
        line = server.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("serving "), (clone.root / "serve-env.log").read_text()
        client = EnvClient(line.split(" at ")[1].split(" ")[0], TOKEN)
        reset = client.reset(task.task_id, policy="newcomer")
        for turn, action in enumerate(patch_to_actions(task.gold_patch)):
            client.step(reset.episode_id, action.tool, action.args, turn=turn)
        verdict = client.close(reset.episode_id)
    assert (verdict.status, verdict.reward) == ("ok", 1.0)
    assert server.returncode == 0  # SIGTERM ends it cleanly


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_the_service_commands_of_the_table_answer_as_printed(clone, container_engine, tiny_lm):
    engines = [{"url": container_engine.base_url, "capacity": 1, "name": "local"}]
    (clone.root / "engines.yaml").write_text(yaml.safe_dump({"sandbox": {"backend": "docker", "engines": engines}}))
    (row,) = map(json.loads, clone.sh("trialforge engines -p engines.yaml").splitlines())
    assert (row["engine"], row["answers"]) == ("local", True)

    model_dir = tiny_lm[0]
    with clone.started(f"trialforge serve lm {model_dir} --port 0", "serve-lm.log") as lm:
        line = lm.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("serving "), (clone.root / "serve-lm.log").read_text()
        models = httpx.get(f"{line.split(' at ')[1].strip()}/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [str(model_dir)]


# --- bad input, and outside the checkout -----------------------------------------------------------------------


@pytest.mark.pure
def test_the_stage_command_names_every_stage():
    shown = invoke("stage", "--help")
    assert shown.exit_code == 0 and all(name in shown.output for name in NAMES), shown.output


@pytest.mark.pure
def test_a_bundled_source_set_to_null_or_empty_is_off_and_one_that_needs_the_repositories_says_so():
    assert load_params(None, {"sources.tickets": None}).sources.tickets is None
    assert load_params(None, {"sources.eval_set": ""}).sources.eval_set is None
    with pytest.raises(ConfigError, match=r"sources\.tickets needs sources\.repos"):
        load_params(None, {"sources.repos": None})
    with pytest.raises(ConfigError, match=r"sources\.synthesize is 2 but sources\.repos is null: set it to 0"):
        load_params(None, {"sources.tickets": None, "sources.repos": None, "sources.synthesize": 2})


@pytest.mark.pure
@pytest.mark.slow
def test_outside_the_checkout_the_bundled_sources_are_found_and_a_mistake_is_one_line(tmp_path):
    def trialforge(args: str) -> subprocess.CompletedProcess[str]:
        script = f"source {VENV}/bin/activate\ntrialforge {args}"
        return subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)

    bundled = trialforge("stage ingest")  # no params.yaml here: the defaults, whose tickets are the checkout's
    assert bundled.returncode == 0 and "\ningest: kept 18 of 19 tasks" in "\n" + bundled.stderr, bundled.stderr
    none = trialforge("stage ingest -S sources.tickets=null -S sources.repos=null -S sources.eval_set=null")
    assert none.returncode == 0 and "ingest: kept 0 of 0 tasks" in none.stderr
    missing = f"error: sources.tickets: mine.jsonl does not exist in {tmp_path}"
    for args, said in (
        ("stage ingest -S sources.tickets=mine.jsonl", missing),
        ("stage ingest -S sources.repos=null", "error: invalid parameters in params.yaml: sources: Value error, "),
        ("validate mine.parquet", "error: no task set at mine.parquet"),
        ("run -S sources.tickets=null -S sources.repos=null", "error: no sources: "),
        ("stage nope", "error: unknown stage 'nope'; stages: " + ", ".join(NAMES)),
    ):
        done = trialforge(args)
        assert done.returncode == 1 and done.stdout == "", (args, done.stdout)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(said), (args, done.stderr)


# --- Prefect: a deployment of prefect.yaml on a worker ---------------------------------------------------------


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_a_deployment_of_prefect_yaml_runs_on_a_work_pools_worker(clone, reproduced, tmp_path):
    """docs/orchestration.md, "A work pool", line by line against a real Prefect server."""
    server = PrefectServer(tmp_path / "prefect")
    server.start()
    try:
        env = server.env | {"PREFECT_WORKER_QUERY_SECONDS": "1"}
        clone.sh("prefect work-pool create trialforge --type process", env=env)
        clone.sh("export TRIALFORGE_HOME=$PWD\nprefect deploy --all", env=env)
        worker = env | {"TRIALFORGE_HOME": str(clone.root)}
        with clone.started("prefect worker start --pool trialforge", "worker.log", env=worker):
            done = clone.sh("prefect deployment run pipeline/training-pipeline --watch", env=env)
    finally:
        server.stop()
    assert "Completed" in done, done + (clone.root / "worker.log").read_text()[-3000:]
