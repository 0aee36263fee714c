"""`trialforge report`, `trialforge compare` and `trialforge tracking ui`: the run report, run comparison (from
stored data alone) and the MLflow UI over the runs' tracking store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from trialforge.config import Params, load_params
from trialforge.errors import TrialforgeError
from trialforge.store.objstore import ObjectStore

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)

StoreOpt = Annotated[
    str | None, typer.Option("--store", help="store URL (file://PATH or s3://bucket/prefix); default: params.yaml's")
]
ParamsOpt = Annotated[Path, typer.Option("--params", "-p", help="params.yaml to read the defaults from")]


@contextmanager
def _opened(store: str | None, params: Path) -> Iterator[tuple[ObjectStore, Params]]:
    """The store (``--store``, else params.yaml's ``run.store``); a trialforge error ends the command, told plainly."""
    from trialforge.runtime import store_url
    from trialforge.store.objstore import open_store

    try:
        loaded = load_params(params, {"run.store": store} if store else None)
        yield open_store(store_url(loaded)), loaded
    except TrialforgeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


@app.command()
def report(
    run: Annotated[str, typer.Argument(help="run id (as printed by `trialforge run`)")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="HTML file; default: OUT_DIR/report-RUN.html")] = None,
    store: StoreOpt = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Write the self-contained HTML report of RUN from its stored episodes."""
    from trialforge.observe.cost import CostRates
    from trialforge.observe.report import render_report

    with _opened(store, params) as (objects, loaded):
        out = out or Path(loaded.run.out_dir) / f"report-{run}.html"
        path = render_report(objects, run, out, thresholds=loaded.observe, rates=CostRates.from_params(loaded))
    typer.echo(f"report: {path.resolve().as_uri()}")


@app.command()
def compare(
    run_a: Annotated[str, typer.Argument(help="baseline run id")],
    run_b: Annotated[str, typer.Argument(help="run id compared with it")],
    store: StoreOpt = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Print every metric of RUN_A and RUN_B side by side with the change (B - A), and their MLflow runs."""
    from trialforge.observe.compare import compare_runs, format_comparison
    from trialforge.observe.tracking import link_lines, read_link

    with _opened(store, params) as (objects, _):
        rows = compare_runs(objects, run_a, run_b)
        links = {run: read_link(objects, run) for run in (run_a, run_b)}
    typer.echo(format_comparison(rows, run_a, run_b))
    for line in link_lines(links):
        typer.echo(line)


tracking_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Experiment tracking (MLflow).")


@tracking_app.command("ui")
def tracking_ui(
    port: Annotated[int, typer.Option("--port", help="port on 127.0.0.1")] = 5000,
    store: StoreOpt = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Serve the MLflow UI on 127.0.0.1 over the runs' tracking store (params.yaml's `tracking`, or
    MLFLOW_TRACKING_URI), with the full mlflow of `.venv-mlflow`; Ctrl-C stops it."""
    import os

    from trialforge.observe.tracking import local_ui, resolve_target, server_argv, server_env

    with _opened(store, params) as (objects, loaded):
        target = resolve_target(loaded, objects.url)
        if target.uri.startswith(("http://", "https://")):
            typer.echo(f"runs are tracked by the MLflow server at {target.uri}: its UI is there")
            return
        argv = server_argv(target.uri, target.artifacts, port)
    if target.artifacts is not None:
        target.artifacts.mkdir(parents=True, exist_ok=True)  # the database's directory with it
    typer.echo(f"MLflow UI over {target.uri}: {local_ui(port)} (Ctrl-C stops it)")
    os.execve(argv[0], argv, server_env())
