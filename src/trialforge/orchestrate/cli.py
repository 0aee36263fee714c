"""`trialforge serve` and `trialforge flow`: the deployments from one process (or, `serve env`, tasks as
environments; `serve lm`, a local LM behind vLLM's API), and any flow run here.

A typer sub-app, registered on the main one (``app.add_typer(orchestrate.cli.app)``); runnable alone
as ``python -m trialforge.orchestrate.cli``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)

FLOWS = ("ingest", "curate", "rollout", "train", "pipeline", "env_server")  # flows/NAME.py:NAME
ParamsOpt = Annotated[Path, typer.Option("--params", "-p", help="params.yaml to read")]
SetOpt = Annotated[list[str], typer.Option("--set", "-S", help="override a param: section.key=value (YAML value)")]


def key_values(pairs: list[str], option: str) -> dict[str, Any]:
    """``KEY=VALUE`` pairs, each VALUE read as YAML (so 2 is a number and [a, b] a list)."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{option} expects KEY=VALUE, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


def prefect_defaults() -> None:
    """A small machine's defaults: no telemetry (Prefect, Ray), and time enough for ephemeral Prefect to start."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def run_flow(name: str, parameters: dict[str, Any]) -> Any:
    """Run ``flows/NAME.py:NAME`` (the checkout's) in this process with progress bars."""
    if name not in FLOWS:
        raise typer.BadParameter(f"unknown flow {name!r}; flows: {', '.join(FLOWS)}")
    prefect_defaults()
    from prefect.flows import load_flow_from_entrypoint

    from trialforge.checkout import flow_entrypoint
    from trialforge.progress import progress_bars

    flow = load_flow_from_entrypoint(flow_entrypoint(name))
    with progress_bars():
        return flow(**parameters)


@app.command("flow")
def flow_command(
    name: Annotated[str, typer.Argument(help="ingest | curate | rollout | train | pipeline | env_server")],
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
    param: Annotated[
        list[str], typer.Option("--param", "-P", help="a flow parameter: run_id=..., iteration=1, shard_size=32 ...")
    ] = [],  # noqa: B006
    runner: Annotated[str | None, typer.Option(help="default | ray: where rollout shards run")] = None,
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster address (runner ray); none: a local Ray")] = None,
) -> None:
    """Run one flow here (ephemeral Prefect unless PREFECT_API_URL is set); --runner ray needs a Prefect server."""
    parameters = {"params_path": str(params), "overrides": key_values(set_, "--set"), **key_values(param, "--param")}
    if runner is not None:
        parameters["runner"] = runner
    if ray_address is not None:
        parameters["ray_address"] = ray_address
    result = run_flow(name, parameters)
    typer.echo(json.dumps(result.model_dump() if hasattr(result, "model_dump") else result, default=str, indent=2))


serve_app = typer.Typer(
    help="Serve the deployments of prefect.yaml, or tasks as environments (`serve env`), or a local LM (`serve lm`)."
)
app.add_typer(serve_app, name="serve")


@serve_app.callback(invoke_without_command=True)
def serve(
    ctx: typer.Context,
    project: Annotated[Path, typer.Option(help="the prefect.yaml whose deployments to serve")] = Path("prefect.yaml"),
    deployment: Annotated[list[str], typer.Option("--deployment", "-d", help="serve only these (repeatable)")] = [],  # noqa: B006
    limit: Annotated[int | None, typer.Option(help="most flow runs at once")] = None,
) -> None:
    """Serve the deployments of prefect.yaml from this process, schedules included (needs PREFECT_API_URL).

    Runs start in the project's directory, where the flows find params.yaml. `trialforge serve env` serves
    tasks as environments for external trainers instead.
    """
    if ctx.invoked_subcommand is not None:
        return
    prefect_defaults()
    from trialforge.orchestrate.serve import serve as serve_deployments

    project = project.resolve()
    os.chdir(project.parent)
    serve_deployments(project, deployment or None, limit)


@serve_app.command("env")
def serve_env(
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
    duration_s: Annotated[float | None, typer.Option("--for", help="stop after this many seconds")] = None,
) -> None:
    """Serve tasks as environments (reset/step/close over HTTP, bearer token) until interrupted (docs/env-server.md).

    Settings: the env_server section of params.yaml (address, task set, splits, limits).
    """
    from trialforge.config import load_params
    from trialforge.envserver.server import served_tasks, serving
    from trialforge.runtime import open_runtime

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # a scheduler's stop ends episodes and writes them first
    with open_runtime(load_params(params, key_values(set_, "--set"))) as rt:
        version, tasks = served_tasks(rt)
        with serving(rt, version, tasks) as address:
            token = address.token_file or f"${rt.params.env_server.token_env}"
            typer.echo(
                f"serving {address.tasks} tasks of {version} at {address.url} (token: {token}); {address.run_id}"
            )
            with contextlib.suppress(KeyboardInterrupt):
                stop.wait(duration_s)


@serve_app.command("lm")
def serve_lm(
    model_dir: Annotated[Path, typer.Argument(help="a transformers causal LM and its tokenizer (save_pretrained)")],
    host: Annotated[str, typer.Option(help="address to listen on (loopback unless you choose)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on (0: a free one)")] = 8000,
    served_model_name: Annotated[str | None, typer.Option(help="the name requests use (default: MODEL_DIR)")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="default and cap of a request's max_tokens")] = 256,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    threads: Annotated[int | None, typer.Option(min=1, help="torch's intra-op threads (default: torch's)")] = None,
) -> None:
    """Serve a local causal LM over vLLM's OpenAI-compatible API until stopped (docs/inference-server.md).

    Chat completions with token ids and log-probabilities, runtime LoRA adapters, and SGLang's
    update_weights_from_disk. Once ready it prints one line, `serving NAME at http://HOST:PORT/v1`.
    """
    from trialforge.errors import TrialforgeError
    from trialforge.inference.server import open_host, running

    try:
        lm = open_host(model_dir, served_model_name or str(model_dir), max_new_tokens, device, threads)
        stop = threading.Event()  # a signal while the model loads ends the process at once: nothing to undo yet
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        with running(lm, host, port) as url:
            typer.echo(f"serving {lm.base} at {url}")  # click flushes it: a parent process reads the URL here
            stop.wait()
    except TrialforgeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


if __name__ == "__main__":
    app()
