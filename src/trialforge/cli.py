"""The `trialforge` command: run the pipeline, or one step of it (as dvc.yaml does)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperGroup

from trialforge.config import Params, load_params
from trialforge.errors import ConfigError, TrialforgeError
from trialforge.ingest_cli import app as ingest_app
from trialforge.ingest_cli import command as ingest_command
from trialforge.observe import cli as observe_cli
from trialforge.orchestrate.cli import app as orchestrate_app
from trialforge.orchestrate.cli import key_values, run_flow
from trialforge.tasks.ingest.sources import SynthesizeRepository

if TYPE_CHECKING:
    from trialforge.tasks.envimages import BuiltImage


class _Commands(TyperGroup):
    """A trialforge error (bad params, a missing file, an engine that does not answer) ends any command with its
    message and status 1, no traceback: it is the user's to fix. Anything else is a bug and keeps its traceback."""

    def invoke(self, ctx: typer.Context) -> object:
        try:
            return super().invoke(ctx)
        except TrialforgeError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None


app = typer.Typer(cls=_Commands, no_args_is_help=True, add_completion=False, help=__doc__)
image_app = typer.Typer(no_args_is_help=True, help="Sandbox images.")
app.add_typer(image_app, name="image")
app.add_typer(orchestrate_app)  # `serve` and `flow NAME` at the top level
app.add_typer(ingest_app, name="ingest", help="Ingest one source (the kinds of sources.extra) into a task set.")
ingest_command(SynthesizeRepository, app)  # `trialforge synthesize`: `ingest synthesize` under its own name
app.command()(observe_cli.report)
app.command()(observe_cli.compare)
app.add_typer(observe_cli.tracking_app, name="tracking")  # `tracking ui`: the MLflow UI over the runs' store

ParamsOpt = Annotated[Path, typer.Option("--params", "-p", help="params.yaml to read")]
SetOpt = Annotated[list[str], typer.Option("--set", "-S", help="override a param: section.key=value (YAML value)")]
VerboseOpt = Annotated[
    int,
    typer.Option(
        "--verbose", "-v", count=True, envvar="TRIALFORGE_VERBOSE",
        help="-v: every INFO line (Prefect's task and flow states, libraries); -vv: DEBUG",
    ),
]  # fmt: skip
LogFormatOpt = Annotated[
    str, typer.Option("--log-format", envvar="TRIALFORGE_LOG_FORMAT", help="text | json (one object per line)")
]


@app.callback()
def main(verbose: VerboseOpt = 0, log_format: LogFormatOpt = "text") -> None:
    """Default: one line per stage, the progress view, the summary, and every warning."""
    from trialforge.observe.logs import configure  # what every command shows: decided there, once

    if log_format not in ("json", "text"):
        raise typer.BadParameter(f"--log-format must be json or text, not {log_format!r}")
    configure(verbose, log_format)  # type: ignore[arg-type]


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
    overrides = key_values(set_, "--set")
    _check_sources(load_params(params, overrides))
    parameters = {
        "params_path": str(params),
        "overrides": overrides,
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
    from trialforge.store import query
    from trialforge.store.objstore import open_store
    from trialforge.train import exports

    if fmt not in ("verl", "trl"):
        raise typer.BadParameter(f"format must be verl or trl, not {fmt!r}")
    store = open_store(store_url(load_params(params)))
    selection = query.Selection(runs=tuple(run_id), policies=tuple(policy))
    done = (exports.export_verl if fmt == "verl" else exports.export_trl)(store, name, selection)
    typer.echo(f"{done.rows} episodes -> {done.uri}")


@image_app.command("build")
def image_build(
    tasks: Annotated[
        Path | None, typer.Option("--tasks", help="a task set (Parquet): build every environment its tasks need")
    ] = None,
    repo: Annotated[
        list[str], typer.Option("--repo", help="NAME=PATH: build the environment detected in a checkout")
    ] = [],  # noqa: B006
    out: Annotated[Path | None, typer.Option("--out", help="with --tasks: write the tasks, images recorded")] = None,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Build the base image (once per machine), and the environment images a task set or repository needs."""
    from trialforge.sandbox.images import base_image
    from trialforge.tasks.envdetect.resolve import resolve_env
    from trialforge.tasks.envimages import env_image
    from trialforge.tasks.setupeval import setup_arguments

    loaded = load_params(params)
    image = base_image()
    typer.echo(json.dumps({"name": image.name, "digest": image.digest, "rootfs": str(image.rootfs)}))
    built: list[BuiltImage] = []
    for name, path in key_values(repo, "--repo").items():
        spec = resolve_env(Path(str(path)), name, loaded.env.repos, evaluate=setup_arguments)
        built.append(env_image(spec, timeout_s=loaded.env.build_timeout_s))
    if tasks is not None:
        built += _task_images(tasks, out, loaded)
    for one in built:
        typer.echo(json.dumps(_image_line(one)))


def _task_images(path: Path, out: Path | None, params: Params) -> list[BuiltImage]:
    from trialforge.runtime import open_runtime
    from trialforge.tasks.envimages import provide_images
    from trialforge.tasks.taskset import read_tasks, write_tasks

    with open_runtime(params) as rt:
        ep = params.env
        provided, funnel, built = provide_images(read_tasks(path), rt.snapshots, ep.repos, timeout_s=ep.build_timeout_s)
    for detail in funnel.details:
        typer.echo(f"dropped {detail['ref']}: {detail['reason']}: {detail['detail'][:500]}", err=True)
    if out is not None:
        write_tasks(out, provided)
    return built


def _image_line(built: BuiltImage) -> dict[str, object]:
    return {
        "name": built.image.name,
        "digest": built.image.digest,
        "built": built.built,
        "seconds": built.seconds,
        "python": built.spec.python,
        "requirements": list(built.spec.requirements),
        "lock": built.lock.split(),
        "build_lock": built.build_lock.split(),
    }


@image_app.command("spec")
def image_spec(
    repo: Annotated[str, typer.Argument(help="NAME=PATH: a repository checkout")],
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Print the environment spec detected in a repository (with params.yaml's ``env.repos`` over it)."""
    from trialforge.tasks.envdetect.resolve import resolve_env
    from trialforge.tasks.envimages import env_key
    from trialforge.tasks.setupeval import setup_arguments

    ((name, path),) = key_values([repo], "repo").items()
    spec = resolve_env(Path(str(path)), name, load_params(params).env.repos, evaluate=setup_arguments)
    typer.echo(json.dumps(spec.model_dump(mode="json") | {"image_key": env_key(spec)}, indent=2))


@app.command()
def reap(
    everything: Annotated[bool, typer.Option(help="remove live sandboxes too")] = False,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Remove what dead runs left behind: bwrap sandboxes, containers (also on every engine of
    ``sandbox.engines``), Podman services and conmons, temp dirs."""
    from trialforge.sandbox.host.leftovers import reap_all

    done = reap_all(everything=everything, engines=load_params(params).sandbox.engines)
    typer.echo(done.summary())
    for kind, names in vars(done).items():
        if names:
            typer.echo(f"  {kind}: {' '.join(names)}")


@app.command()
def engines(params: ParamsOpt = Path("params.yaml")) -> None:
    """Ask every engine of ``sandbox.engines`` how it is: answers (or why not), version, whether it holds the
    base image by digest, trialforge sandboxes running. One JSON line each; exit 1 if one does not answer."""
    from trialforge.sandbox.container.fleet import survey
    from trialforge.sandbox.images import base_image

    endpoints = load_params(params).sandbox.engines
    if not endpoints:
        raise typer.BadParameter(f"{params} lists no sandbox.engines", param_hint="--params")
    rows = survey(endpoints, base_image(build=False))
    for row in rows:
        typer.echo(json.dumps(row))
    if not all(row["answers"] for row in rows):
        raise typer.Exit(1)


@app.command()
def stage(
    name: Annotated[
        str, typer.Argument(help="ingest | images | validate | decontaminate | quality | tier | train | report")
    ],
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
) -> None:
    """Run one stage of dvc.yaml file to file, in out/, with the lines, progress and funnel `trialforge run`
    shows (a task stage's funnel: out/funnel/NAME.json)."""
    from trialforge.stages import run_stage

    run_stage(name, load_params(params, key_values(set_, "--set")))


@app.command()
def validate(
    tasks: Annotated[Path, typer.Argument(help="a task set file, e.g. what `trialforge ingest KIND` wrote")],
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
) -> None:
    """Curate a task file as `trialforge run` curates its sources: environments, validation in sandboxes,
    decontamination, the quality gate and tiers, with progress and the funnel. What it keeps is published as the
    task set (out/tasks/taskset.parquet, and the store, where `trialforge serve env` finds it)."""
    from trialforge.observe.metrics import task_metrics
    from trialforge.observe.summary import print_tasks
    from trialforge.tasks.taskset import read_tasks

    overrides = key_values(set_, "--set")
    loaded = load_params(params, overrides)
    read_tasks(tasks)  # a file that is no task set: one line, before the flow starts
    result = run_flow("curate", {"params_path": str(params), "overrides": overrides, "tasks_file": str(tasks)})
    where = Path(loaded.run.out_dir) / "tasks" / "taskset.parquet"
    print_tasks(task_metrics(result.funnels), footer=f"{result.tasks} tasks published as {result.version}: {where}")


def _check_sources(params: Params) -> None:
    """Before the pipeline starts: it has a source, and the bundled ones params.yaml names exist (here, or in the
    checkout). A ConfigError of one line, not a failed flow run."""
    from trialforge.checkout import source_path

    sources = params.sources
    if not (sources.tickets or sources.synthesize or sources.extra):
        raise ConfigError("no sources: sources.tickets, sources.synthesize and sources.extra name none to ingest")
    for setting in ("tickets", "repos", "eval_set"):
        if path := getattr(sources, setting):
            source_path(path, f"sources.{setting}")


if __name__ == "__main__":
    app()
