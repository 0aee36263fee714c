"""Experiment tracking with MLflow, against real tracking servers (`mlflow server` of .venv-mlflow, on 127.0.0.1).

A small pipeline run (the Prefect flow: three bundled tickets; gold, noop and the learner `repair`; two
iterations) is tracked by a server; everything is read back through ``MlflowClient``: the params are the
resolved params.yaml, each metric holds one value per iteration at its step, equal to metrics.json's, the tags
name the task set and every image digest, the artifacts are the report, metrics.json and the plots. Then: the
offline default (a SQLite store inside the run's store, served by `trialforge tracking ui`), a server that is
down when the run starts, and one that dies mid-run: each time one warning, and the run goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO_ROOT
from fixtures.observe.runs import write_r1
from mlflow import MlflowClient
from support.cli_runner import invoke
from support.prefect_server import free_port
from support.processes import wait_for
from test_orchestration import load_flow, params_path, small_overrides, tickets  # noqa: F401 (fixtures)

from trialforge.config import load_params
from trialforge.observe.compare import scalar_leaves
from trialforge.observe.run_report import finish_run
from trialforge.observe.tracking import (
    HTTP_LIMITS,
    TrackingError,
    metric_name,
    mlflow_server,
    open_tracker,
    read_link,
    safe_name,
    server_argv,
    server_env,
)
from trialforge.store.objstore import ObjectStore, open_store
from trialforge.tasks.taskset import TASKS, read_published

RUN = "tracked-1"
TRACKER_LOG = "trialforge.observe.tracking"


# --- real servers -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def process_group(argv: list[str], root: Path, url: str) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` in a process group of its own (cwd ``root``) until ``url``/health answers 200; then the whole
    group is stopped, and nothing of it may be left."""
    with (root / "server.log").open("wb") as log:
        process = subprocess.Popen(
            argv, cwd=root, env=server_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        try:
            wait_for(lambda: _healthy(url), f"{argv[:2]} to answer on {url}", process, timeout=180)
        except AssertionError as exc:
            pytest.fail(f"{exc}:\n{(root / 'server.log').read_text(errors='replace')[-3000:]}")
        yield process
    finally:
        _stop_group(process)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the group (mlflow server, its uvicorn), SIGKILL to whatever outlives 30 s; returns once the
    group is empty (its leader reaped here, the rest by init)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        wait_for(lambda: _group_gone(process), "the server's process group to exit", timeout=30)
    except AssertionError:  # what outlives SIGTERM
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        wait_for(lambda: _group_gone(process), "the server's process group to exit after SIGKILL", timeout=30)


def _group_gone(process: subprocess.Popen[bytes]) -> bool:
    process.poll()  # reap the leader, so that an exited one does not keep the group alive as a zombie
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return True
    return False


def _mlflow() -> Path:
    try:
        return mlflow_server()
    except TrackingError as exc:
        pytest.fail(str(exc))


@contextlib.contextmanager
def tracking_server(root: Path) -> Iterator[str]:
    """``mlflow server`` on a free port of 127.0.0.1, SQLite and artifacts under ``root`` (removed after)."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = server_argv(f"sqlite:///{root / 'mlflow.db'}", root / "artifacts", port, _mlflow())
    try:
        with process_group(argv, root, url):
            yield url
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    with tracking_server(tmp_path_factory.mktemp("mlflow-server")) as url:
        yield url


@pytest.fixture
def http_limits(monkeypatch):
    """The tracker sets MLflow's HTTP retry limits in this process's environment: put back after the test."""
    for name in HTTP_LIMITS:
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def no_tracking_env(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


# --- a pipeline run tracked by the server -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tracked(server, prefect_api, params_path, tickets, tmp_path_factory) -> SimpleNamespace:  # noqa: F811
    root = tmp_path_factory.mktemp("tracked")
    overrides = small_overrides(tickets, root) | {
        "rollout.policies": ["gold", "noop", "repair"],
        "rollout.group_size": 2,
        "curate.sampler.max_extra_draws": 0,
        "train.iterations": 2,
        "observe.learning.effective_batch.action": "warn",  # a step each iteration, whatever the batch
        "tracking.uri": server,
        "tracking.experiment": "tracking-test",
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        for name in HTTP_LIMITS:
            patch.setenv(name, "0")
            patch.delenv(name)
        metrics = load_flow("pipeline")(params_path=params_path, overrides=overrides, run_id=RUN)
    store = open_store(overrides["run.store"])
    link = read_link(store, RUN)
    assert link is not None, "the run stored no link to its MLflow run"
    client = MlflowClient(server)
    return SimpleNamespace(
        metrics=metrics,
        params=load_params(Path(params_path), overrides),
        store=store,
        out=root / "out",
        client=client,
        run=client.get_run(link.mlflow_run_id),
        link=link,
        server=server,
    )


def history(client: MlflowClient, run_id: str, name: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, metric_name(name)))


@pytest.mark.sandbox
@pytest.mark.services
def test_the_run_is_one_finished_mlflow_run_named_by_its_run_id_and_the_summary_links_to_it(tracked):
    run = tracked.run
    assert run.info.status == "FINISHED" and run.info.run_name == RUN
    assert run.data.tags["trialforge.run_id"] == RUN
    assert tracked.client.get_experiment(run.info.experiment_id).name == "tracking-test"
    page = f"{tracked.server}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    assert tracked.metrics["tracking"] | {"off": None} == {
        "uri": tracked.server,
        "experiment": "tracking-test",
        "mlflow_run_id": run.info.run_id,
        "url": page,
        "serve": None,
        "off": None,
    }
    assert json.loads((tracked.out / "metrics.json").read_text())["tracking"]["url"] == page


def leaves(node: dict, prefix: str = "") -> Iterator[tuple[str, object]]:
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.sandbox
@pytest.mark.services
def test_params_are_the_resolved_params_yaml_key_by_key_and_whole(tracked, tmp_path):
    resolved = tracked.params.model_dump(mode="json", by_alias=True)
    logged = tracked.run.data.params
    expected = {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in leaves(resolved)}
    assert logged == expected
    assert logged["train.iterations"] == "2" and logged["rollout.policies"] == '["gold", "noop", "repair"]'
    assert logged["validate.runs"] == "1" and logged["tracking.uri"] == tracked.server
    path = tracked.client.download_artifacts(tracked.run.info.run_id, "params.yaml", str(tmp_path))
    assert yaml.safe_load(Path(path).read_text()) == resolved


@pytest.mark.sandbox
@pytest.mark.services
def test_every_iteration_metric_has_one_value_per_iteration_at_its_step_as_in_metrics_json(tracked):
    client, run_id = tracked.client, tracked.run.info.run_id
    iterations = tracked.metrics["iterations"]
    steps = sorted(int(i) for i in iterations)
    assert steps == [0, 1]  # no held-out tasks: the eval round after the last update has nothing to roll out
    names = set().union(*(scalar_leaves(iterations[str(i)]) for i in steps))
    assert names >= {
        "pass_rate.gold", "pass_rate.noop", "pass_rate.repair", "mean_reward.gold", "env_error_rate",
        "verifier_error_rate", "zero_variance_groups.fraction", "latency.sandbox_s.p50", "latency.verify_s.p90",
        "endings.model.submitted", "endings.model.context_exhausted", "endings.infrastructure.sandbox",
    }  # fmt: skip
    assert any(name.startswith("pass_rate_by_tier.") for name in names)
    for name in names:
        want = [(i, value) for i in steps if (value := scalar_leaves(iterations[str(i)]).get(name)) is not None]
        assert history(client, run_id, name) == [(i, pytest.approx(v)) for i, v in want], name
    assert history(client, run_id, "pass_rate.gold") == [(0, 1.0), (1, 1.0)]
    assert history(client, run_id, "pass_rate.noop") == [(0, 0.0), (1, 0.0)]
    last_bin = [(i, iterations[str(i)]["reward_hist"]["counts"][-1]) for i in steps]
    assert history(client, run_id, "reward_hist.0.9-1") == last_bin


@pytest.mark.sandbox
@pytest.mark.services
def test_the_learners_steps_and_the_run_wide_figures_are_logged(tracked):
    client, run_id = tracked.client, tracked.run.info.run_id
    updates = tracked.metrics["updates"]
    assert [u["iteration"] for u in updates] == [0, 1]
    assert history(client, run_id, "train.behaviour_lag") == [(u["iteration"], u["behaviour_lag"]) for u in updates]
    drawn = [(u["iteration"], u["sampler"]["drawn"]) for u in updates]
    assert history(client, run_id, "train.sampler.drawn") == drawn
    overall = tracked.metrics["overall"]
    assert history(client, run_id, "overall.pass_rate.gold") == [(1, overall["pass_rate"]["gold"])]
    assert history(client, run_id, "overall.episodes") == [(1, overall["episodes"])]
    kept = tracked.metrics["tasks"]["validate"]["kept"]
    assert history(client, run_id, "tasks.validate.kept") == [(1, kept)]
    cost = tracked.metrics["cost"]["overall"]
    assert cost["totals"]["used_cpu_s"] > 0 and cost["cpu_measured"] == cost["episodes"]
    for name in ("totals.used_cpu_s", "totals.reserved_cpu_s", "per_valid_trajectory.sandbox_s", "cpu_used_share"):
        value = cost
        for key in name.split("."):
            value = value[key]
        assert history(client, run_id, f"cost.{name}") == [(1, pytest.approx(value))], name


@pytest.mark.sandbox
@pytest.mark.services
def test_tags_name_the_task_set_and_the_digest_of_every_image(tracked):
    tags = tracked.run.data.tags
    version = tracked.metrics["task_set_version"]
    assert tags["trialforge.task_set_version"] == version
    _, tasks = read_published(tracked.store, TASKS, version)
    images = {t.image: t.image_digest for t in tasks if t.image}
    assert images and all(images.values())
    assert {k: v for k, v in tags.items() if k.startswith("trialforge.image.")} == {
        safe_name(f"trialforge.image.{image}"): digest for image, digest in images.items()
    }
    assert tags["trialforge.code_version"]


@pytest.mark.sandbox
@pytest.mark.services
def test_artifacts_are_the_report_metrics_json_and_the_plots(tracked, tmp_path):
    client, run_id = tracked.client, tracked.run.info.run_id
    assert {a.path for a in client.list_artifacts(run_id)} == {"report.html", "metrics.json", "params.yaml", "plots"}
    plots = {Path(a.path).name for a in client.list_artifacts(run_id, "plots")}
    assert plots == {p.name for p in (tracked.out / "plots").iterdir()} and "pass_rate.csv" in plots
    for name in ("metrics.json", "report.html"):
        got = Path(client.download_artifacts(run_id, name, str(tmp_path)))
        assert got.read_bytes() == (tracked.out / name).read_bytes()
    # the report links back to its MLflow run
    assert f'runs/{run_id}">MLflow run {run_id}</a></p>' in (tracked.out / "report.html").read_text()


@pytest.mark.sandbox
@pytest.mark.services
def test_compare_names_each_runs_mlflow_page_and_the_page_comparing_them(tracked, params_path, tmp_path):  # noqa: F811
    write_r1(tracked.store)  # a second run in the same store, tracked by the same server
    params = load_params(None, {"run.out_dir": str(tmp_path / "out"), "tracking.uri": tracked.server})
    other = finish_run(SimpleNamespace(params=params, store=tracked.store), "r1", [], [], [], {})  # type: ignore[arg-type]
    result = invoke("compare", RUN, "r1", "--store", tracked.store.url, "--params", params_path)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"MLflow {RUN}: run {tracked.run.info.run_id} {tracked.link.url()}" in lines
    assert f"MLflow r1: run {other['tracking']['mlflow_run_id']} {other['tracking']['url']}" in lines
    runs = f"%5B%22{tracked.run.info.run_id}%22%2C%20%22{other['tracking']['mlflow_run_id']}%22%5D"
    assert f"MLflow side by side: {tracked.server}/#/compare-runs?runs={runs}&experiments=%5B%22" in lines[-1]


# --- without a server, and when the server is gone ---------------------------------------------------------------


def finish_r1(root: Path, **tracking) -> tuple[ObjectStore, SimpleNamespace, dict]:
    """Close the hand-made run ``r1`` (two iterations of stored episodes) as the DVC report stage does."""
    store = open_store(f"file://{root / 'store'}")
    if not store.exists("datasets"):
        write_r1(store)
    overrides = {"run.out_dir": str(root / "out")} | {f"tracking.{k}": v for k, v in tracking.items()}
    rt = SimpleNamespace(params=load_params(None, overrides), store=store)
    return store, rt, finish_run(rt, "r1", [], [], [], {})  # type: ignore[arg-type]


@pytest.mark.services
def test_without_a_server_a_run_is_tracked_in_sqlite_inside_its_store_and_tracking_ui_serves_it(tmp_path, capsys):
    store, _, metrics = finish_r1(tmp_path)
    db = (tmp_path / "store" / "mlflow" / "mlflow.db").resolve()
    assert db.exists() and metrics["tracking"]["uri"] == f"sqlite:///{db}"
    assert metrics["tracking"]["serve"] == "trialforge tracking ui"
    said = " ".join(capsys.readouterr().out.split())
    assert "`trialforge tracking ui`, then http://127.0.0.1:5000/#/experiments/" in said
    link = read_link(store, "r1")
    assert link is not None
    local = MlflowClient(f"sqlite:///{db}")
    assert history(local, link.mlflow_run_id, "pass_rate.repair") == [(0, 0.25), (1, 1.0)]
    run_dir = tmp_path / "store" / "mlflow" / "mlartifacts" / link.mlflow_run_id / "artifacts"
    assert {p.name for p in run_dir.iterdir()} == {"report.html", "metrics.json", "params.yaml", "plots"}

    _, _, again = finish_r1(tmp_path)  # the report stage run again: the same MLflow run, nothing twice
    assert again["tracking"]["mlflow_run_id"] == link.mlflow_run_id
    assert history(local, link.mlflow_run_id, "pass_rate.repair") == [(0, 0.25), (1, 1.0)]
    assert history(local, link.mlflow_run_id, "overall.episodes") == [(1, 14)]

    port = free_port()
    argv = [sys.executable, "-m", "trialforge.cli", "tracking", "ui", "--port", str(port), "--store", store.url]
    with process_group(argv, tmp_path, f"http://127.0.0.1:{port}"):
        served = MlflowClient(f"http://127.0.0.1:{port}")
        assert history(served, link.mlflow_run_id, "pass_rate.repair") == [(0, 0.25), (1, 1.0)]
        query = f"path=report.html&run_uuid={link.mlflow_run_id}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/get-artifact?{query}", timeout=30) as page:
            assert page.read() == (tmp_path / "out" / "report.html").read_bytes()


@pytest.mark.pure
def test_a_server_that_is_down_costs_one_warning_and_the_run_goes_on(tmp_path, caplog, capsys, http_limits):
    dead = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING):
        _, _, metrics = finish_r1(tmp_path, uri=dead)
    warnings = [r for r in caplog.records if r.name == TRACKER_LOG]
    assert len(warnings) == 1 and dead in warnings[0].getMessage() and "goes on" in warnings[0].getMessage()
    assert (tmp_path / "out" / "report.html").exists() and (tmp_path / "out" / "metrics.json").exists()
    assert metrics["tracking"]["mlflow_run_id"] is None and "does not answer" in metrics["tracking"]["off"]
    assert "tracking: off: opening the MLflow run failed" in " ".join(capsys.readouterr().out.split())


@pytest.mark.services
def test_a_server_that_dies_mid_run_costs_one_warning_and_the_run_goes_on(tmp_path, caplog, capsys, http_limits):
    store = open_store(f"file://{tmp_path / 'store'}")
    write_r1(store)
    with tracking_server(tmp_path / "server") as url:
        params = load_params(None, {"run.out_dir": str(tmp_path / "out"), "tracking.uri": url})
        tracker = open_tracker(params, store, "r1")
        tracker.log_iteration(0)
        mlflow_run = tracker.summary()["mlflow_run_id"]
        assert history(MlflowClient(url), mlflow_run, "pass_rate.repair") == [(0, 0.25)]
    with caplog.at_level(logging.WARNING):
        tracker.log_iteration(1)
        rt = SimpleNamespace(params=params, store=store)
        metrics = finish_run(rt, "r1", [], [], [], {}, tracker)  # type: ignore[arg-type]
    # MLflow's retries are bounded while the run waits on a dead server (its default backs off for minutes)
    assert {name: os.environ[name] for name in HTTP_LIMITS} == HTTP_LIMITS
    warnings = [r for r in caplog.records if r.name == TRACKER_LOG]
    assert len(warnings) == 1 and "logging iteration 1 failed" in warnings[0].getMessage()
    assert metrics["tracking"]["mlflow_run_id"] == mlflow_run and metrics["iterations"]["1"]["episodes"] == 4
    assert (tmp_path / "out" / "report.html").exists()
    assert f"MLflow run {mlflow_run} (experiment demo), then no more" in " ".join(capsys.readouterr().out.split())


@pytest.mark.pure
def test_tracking_params_are_checked_and_never_change_a_runs_digest():
    base = load_params(None)
    assert load_params(None, {"tracking.uri": "http://127.0.0.1:5000"}).digest() == base.digest()
    assert load_params(None, {"tracking.enabled": False}).digest() == base.digest()
    with pytest.raises(Exception, match="is not a tracking URI"):
        load_params(None, {"tracking.uri": "mlruns"})
    assert load_params(REPO_ROOT / "params.yaml").tracking.uri == ""
