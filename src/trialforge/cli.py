"""The `trialforge` command: run the pipeline, or one step of it (as dvc.yaml does)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from trialforge.config import load_params
from trialforge.observe import cli as observe_cli

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
image_app = typer.Typer(no_args_is_help=True, help="Sandbox images.")
app.add_typer(image_app, name="image")
app.command()(observe_cli.report)
app.command()(observe_cli.compare)

ParamsOpt = Annotated[Path, typer.Option("--params", "-p", help="params.yaml to read")]
SetOpt = Annotated[list[str], typer.Option("--set", "-S", help="override a param: section.key=value (YAML value)")]


def _overrides(pairs: list[str]) -> dict:
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise typer.BadParameter(f"--set expects section.key=value, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


def _prefect_defaults() -> None:
    # Ephemeral Prefect on a small machine: no telemetry, and time enough for its first start.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("DO_NOT_TRACK", "1")


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
def run(params: ParamsOpt = Path("params.yaml"), set_: SetOpt = []) -> None:  # noqa: B006
    """Run the whole pipeline as one Prefect flow (ephemeral Prefect unless PREFECT_API_URL is set)."""
    _prefect_defaults()
    from prefect.flows import load_flow_from_entrypoint

    flow = load_flow_from_entrypoint("flows/pipeline.py:pipeline")
    flow(params_path=str(params), overrides=_overrides(set_))


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
    """Remove sandboxes that crashed runs left behind."""
    from trialforge.sandbox.reaper import reap as reap_sandboxes

    removed = reap_sandboxes(everything=everything)
    typer.echo(f"removed {len(removed)} sandboxes")


@app.command()
def stage(
    name: Annotated[str, typer.Argument(help="ingest | validate | decontaminate | tier | train | report")],
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
) -> None:
    """Run one pipeline stage file-to-file (what dvc.yaml calls)."""
    from trialforge.stages import run_stage

    run_stage(name, load_params(params, _overrides(set_)))


if __name__ == "__main__":
    app()
