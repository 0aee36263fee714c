"""`trialforge ingest KIND`: one source into a task set (Parquet), with what was kept and dropped and why.

The same typed entries as ``sources.extra`` in params.yaml (``tasks/ingest/sources.py``), built from the
command line: what this prints is what the pipeline's ingest step will take from that entry. The snapshots
go to params.yaml's ``run.store``, where the rest of the pipeline finds them; ``sources.caps`` applies.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import typer
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from trialforge.config import load_params
from trialforge.funnel import Funnel
from trialforge.orchestrate.cli import key_values
from trialforge.tasks.ingest.sources import OnCommandLine, SourceEntry, SynthesizeRepository, ingest_source
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.taskset import write_tasks

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)

SHOWN_DROPS = 10  # dropped records listed with their detail; the counts cover all of them
_NAME = re.compile(r"^[\w.-]+(?:/[\w.-]+)?$")  # a repository name: NAME or owner/NAME

ParamsOpt = Annotated[Path, typer.Option("--params", "-p", help="params.yaml to read (run.store, sources.caps)")]
SetOpt = Annotated[list[str], typer.Option("--set", "-S", help="override a param: section.key=value (YAML value)")]
OutOpt = Annotated[
    Path | None, typer.Option("--out", "-o", help="task set to write; default: OUT_DIR/tasks/ingested-KIND.parquet")
]
KEYWORD = inspect.Parameter.KEYWORD_ONLY


def command(entry: type[BaseModel], target: typer.Typer = app) -> None:
    """``trialforge ingest KIND`` (or ``KIND`` of ``target``), one option (or the argument) per field of ``entry``,
    its help the description."""
    kind = get_args(entry.model_fields["kind"].annotation)[0]
    fields = {name: f for name, f in entry.model_fields.items() if name != "kind"}
    filled = {_cli(f).name_into for f in fields.values()}  # given as NAME= before another field's value
    options = [_parameter(name, f, fields) for name, f in fields.items() if name not in filled]
    common = [
        inspect.Parameter("params", KEYWORD, annotation=ParamsOpt, default=Path("params.yaml")),
        inspect.Parameter("set_", KEYWORD, annotation=SetOpt, default=[]),
        inspect.Parameter("out", KEYWORD, annotation=OutOpt, default=None),
    ]

    def run(params: Path, set_: list[str], out: Path | None, **given: Any) -> None:
        values: dict[str, Any] = {"kind": kind}
        for name, value in given.items():
            cli, flag = _cli(fields[name]), _flag(name, fields[name])
            if _is_map(fields[name]):
                values[name] = _pairs(value, f"{flag} expects {cli.written}")
            elif cli.name_into:
                values[cli.name_into], values[name] = _named(value, f"{flag} expects {cli.written}")
            else:
                values[name] = value
        _ingest(values, params, set_, out)

    run.__signature__ = inspect.Signature(options + common)  # type: ignore[attr-defined]
    target.command(kind, help=entry.__doc__)(run)


def _cli(field: FieldInfo) -> OnCommandLine:
    return next((m for m in field.metadata if isinstance(m, OnCommandLine)), OnCommandLine())


def _parameter(name: str, field: FieldInfo, fields: dict[str, FieldInfo]) -> inspect.Parameter:
    """The typer parameter of one field: its type, default and help, as the field declares them."""
    cli, text = _cli(field), field.description or ""
    kind = list[str] if _is_map(field) else field.annotation
    if cli.written:
        text = f"{cli.written}: {text}"
    if cli.name_into:
        text += f" (NAME: {fields[cli.name_into].description})"
    if _is_map(field):
        text += " (repeatable)"
    flag = _flag(name, field)
    if field.annotation is bool and field.default is True:  # a switch on by default: --pr-mirror / --no-pr-mirror
        flag = f"{flag}/--no-{flag.removeprefix('--')}"
    spec = typer.Argument(help=text) if cli.argument else typer.Option(flag, help=text)
    default = inspect.Parameter.empty if field.is_required() else field.default
    return inspect.Parameter(name, KEYWORD, annotation=Annotated[kind, spec], default=default)


def _ingest(fields: dict[str, Any], params_path: Path, set_: list[str], out: Path | None) -> None:
    """Build the entry, ingest it, write the task set and print the funnel (a trialforge error exits 1: cli.py)."""
    from trialforge.progress import progress_bars
    from trialforge.runtime import open_runtime, store_url
    from trialforge.sandbox.images import cache_root
    from trialforge.store.objstore import open_store

    try:
        entry: Any = TypeAdapter(SourceEntry).validate_python(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:])) or 'entry'}: {e['msg']}" for e in exc.errors())
        raise typer.BadParameter(problems) from None
    params = load_params(params_path, key_values(set_, "--set"))
    if isinstance(entry, SynthesizeRepository):  # the only kind that runs sandboxes: the run's, as the pipeline's
        with progress_bars(), open_runtime(params) as rt:
            tasks, funnel = ingest_source(entry, rt.snapshots, params.sources.caps, params.env.repos, rt.synthesizer())
    else:
        snapshots = SnapshotStore(open_store(store_url(params)), cache_root() / "snapshots")
        tasks, funnel = ingest_source(entry, snapshots, params.sources.caps, params.env.repos)
    dest = out or Path(params.run.out_dir) / "tasks" / f"ingested-{entry.kind}.parquet"
    version = write_tasks(dest, tasks)
    for line in funnel_lines(funnel):
        typer.echo(line)
    typer.echo(f"wrote {len(tasks)} tasks to {dest} (task set {version}); curate them: trialforge validate {dest}")


def funnel_lines(funnel: Funnel, shown: int = SHOWN_DROPS) -> list[str]:
    """The funnel as a person reads it: kept of seen, drops by reason, then the first drops with their detail."""
    lines = [f"{funnel.stage}: kept {funnel.kept} of {funnel.seen}"]
    lines += [f"  dropped {n} {reason}" for reason, n in funnel.dropped.most_common()]
    if funnel.details:
        more = len(funnel.details) - shown
        lines.append("first drops:" if more > 0 else "drops:")
        lines += [f"  {d['ref']}: {d['reason']}: {d['detail']}" for d in funnel.details[:shown]]
        if more > 0:
            lines.append(f"  ... and {more} more")
    return lines


def _is_map(field: FieldInfo) -> bool:
    return get_origin(field.annotation) is dict


def _flag(name: str, field: FieldInfo) -> str:
    return _cli(field).flag or "--" + name.replace("_", "-")


def _pairs(pairs: list[str], expects: str) -> dict[str, str]:
    """``NAME=VALUE`` pairs (``owner/name=PATH_OR_URL``) as a map; each needs its name."""
    values: dict[str, str] = {}
    for pair in pairs:
        name, value = _split_repo(pair)
        if not name:
            raise typer.BadParameter(f"{expects}, got {pair!r}")
        values[name] = value
    return values


def _named(value: str, expects: str) -> tuple[str, str]:
    """``[NAME=]VALUE``: the name may be left out ("": the last component of the path or URL)."""
    name, source = _split_repo(value)
    if not source:
        raise typer.BadParameter(f"{expects}, got {value!r}")
    return name, source


def _split_repo(value: str) -> tuple[str, str]:
    """(name, source) of ``NAME=SOURCE``; ("", value) when the text before ``=`` is no repository name (a path
    or URL may hold ``=`` too)."""
    name, sep, source = value.partition("=")
    if sep and _NAME.match(name):
        return name, source
    return "", value


for _entry in get_args(get_args(SourceEntry)[0]):
    command(_entry)
