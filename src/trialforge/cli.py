"""The `trialforge` command: run the pipeline, or one step of it (as dvc.yaml does)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from trialforge.config import load_params
from trialforge.observe import cli as observe_cli
from trialforge.orchestrate.cli import app as orchestrate_app
from trialforge.orchestrate.cli import key_values, run_flow

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
image_app = typer.Typer(no_args_is_help=True, help="Sandbox images.")
app.add_typer(image_app, name="image")
app.add_typer(orchestrate_app)  # `serve` and `flow NAME` at the top level
app.command()(observe_cli.report)
app.command()(observe_cli.compare)

ParamsOpt = Annotated[Path, typer.Option("--params", "-p", help="params.yaml to read")]
SetOpt = Annotated[list[str], typer.Option("--set", "-S", help="override a param: section.key=value (YAML value)")]


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
    log_format: Annotated[str, typer.Option("--log-format", help="json (one object per line) | text")] = "text",
) -> None:
    from trialforge.observe.logs import setup_logging

    if log_format not in ("json", "text"):
        raise typer.BadParameter(f"--log-format must be json or text, not {log_format!r}")
    setup_logging(logging.INFO if verbose else logging.WARNING, fmt=log_format)  # type: ignore[arg-type]


@app.command()
def run(
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
    run_id: Annotated[str | None, typer.Option("--run-id", help="resume this run (default: a new run)")] = None,
    runner: Annotated[str, typer.Option("--runner", help="default | ray")] = "default",
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Ray cluster address")] = None,
    shard_size: Annotated[int, typer.Option("--shard-size", help="episodes per Prefect task")] = 64,
) -> None:
    """Run the whole pipeline as one Prefect flow (ephemeral Prefect unless PREFECT_API_URL is set)."""
    parameters = {
        "params_path": str(params),
        "overrides": key_values(set_, "--set"),
        "run_id": run_id,
        "runner": runner,
        "ray_address": ray_address,
        "shard_size": shard_size,
    }
    run_flow("pipeline", parameters)


@app.command()
def export(
    fmt: Annotated[str, typer.Argument(help="verl | trl")],
    name: Annotated[str, typer.Argument(help="export name (datasets/FORMAT/export=NAME)")],
    run_id: Annotated[list[str], typer.Option("--run", help="runs to include (default: all)")] = [],  # noqa: B006
    policy: Annotated[list[str], typer.Option("--policy", help="policies to include (default: all)")] = [],  # noqa: B006
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Export ok episodes as verl- or TRL-style Parquet in the object store."""
    from trialforge.runtime import store_url
    from trialforge.store import exports, query
    from trialforge.store.objstore import open_store

    if fmt not in ("verl", "trl"):
        raise typer.BadParameter(f"format must be verl or trl, not {fmt!r}")
    store = open_store(store_url(load_params(params)))
    selection = query.Selection(runs=tuple(run_id), policies=tuple(policy))
    done = (exports.export_verl if fmt == "verl" else exports.export_trl)(store, name, selection)
    typer.echo(f"{done.rows} episodes -> {done.uri}")


@image_app.command("build")
def image_build() -> None:
    """Build the base sandbox image from Debian packages (once per machine)."""
    from trialforge.sandbox.images import base_image

    image = base_image()
    typer.echo(json.dumps({"name": image.name, "digest": image.digest, "rootfs": str(image.rootfs)}))


@app.command()
def reap(everything: Annotated[bool, typer.Option(help="remove live sandboxes too")] = False) -> None:
    """Remove what dead runs left behind: bwrap sandboxes, containers, Podman services and conmons, temp dirs."""
    from trialforge.sandbox.leftovers import reap_all

    done = reap_all(everything=everything)
    typer.echo(done.summary())
    for kind, names in vars(done).items():
        if names:
            typer.echo(f"  {kind}: {' '.join(names)}")


@app.command()
def stage(
    name: Annotated[str, typer.Argument(help="ingest | validate | decontaminate | tier | train | report")],
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
) -> None:
    """Run one pipeline stage file-to-file (what dvc.yaml calls)."""
    from trialforge.stages import run_stage

    run_stage(name, load_params(params, key_values(set_, "--set")))


if __name__ == "__main__":
    app()
