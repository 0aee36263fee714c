"""`trialforge ingest KIND`: one source into a task set (Parquet), with what was kept and dropped and why.

The same typed entries as ``sources.extra`` in params.yaml (``tasks/ingest/sources.py``), built from the
command line: what this prints is what the pipeline's ingest step will take from that entry. The snapshots
go to params.yaml's ``run.store``, where the rest of the pipeline finds them; ``sources.caps`` applies.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import TypeAdapter, ValidationError

from trialforge.config import load_params
from trialforge.funnel import Funnel
from trialforge.orchestrate.cli import key_values
from trialforge.tasks.ingest.fixes import MAX_CHANGED_LINES
from trialforge.tasks.ingest.sources import SourceEntry, ingest_source
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
ReposOpt = Annotated[
    list[str], typer.Option("--repo", help="owner/name=PATH_OR_URL: where an instance's repository is (repeatable)")
]
OneRepoOpt = Annotated[
    str, typer.Option("--repo", help="[NAME=]PATH_OR_URL: the git repository (NAME: the tasks' repo name)")
]
RevOpt = Annotated[str, typer.Option("--rev", help="history reachable from this revision")]
MaxLinesOpt = Annotated[int, typer.Option("--max-changed-lines", help="a larger fix is not a task")]


@app.command("github")
def github(
    tickets: Annotated[Path, typer.Argument(help="issue export with linked fixes (JSON lines)")],
    repos: Annotated[Path, typer.Option("--repos", help="directory of the fixed repositories, one per name")],
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
    out: OutOpt = None,
) -> None:
    """A GitHub issue export with each issue's merged fix (the bundled demo's format)."""
    _ingest({"kind": "github", "tickets": str(tickets), "repos": str(repos)}, params, set_, out)


@app.command("github-api")
def github_api(
    export: Annotated[Path, typer.Argument(help="issues and pull requests as the REST API returns them")],
    repo: ReposOpt,
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
    out: OutOpt = None,
) -> None:
    """Merged pull requests that close issues, from a saved GitHub REST API export (JSON lines or array)."""
    _ingest({"kind": "github-api", "path": str(export), "repos": _repo_map(repo)}, params, set_, out)


@app.command("jira")
def jira(
    export: Annotated[Path, typer.Argument(help="Jira CSV export")],
    repo: OneRepoOpt,
    rev: RevOpt = "HEAD",
    tz: Annotated[str, typer.Option("--tz", help="zone of the export's dates (IANA name)")] = "UTC",
    max_changed_lines: MaxLinesOpt = MAX_CHANGED_LINES,
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
    out: OutOpt = None,
) -> None:
    """Fixed Jira tickets, each linked to the commit of REPO that names its key."""
    name, source = _one_repo(repo)
    fields = {"kind": "jira", "path": str(export), "repo": source, "repo_name": name, "rev": rev, "tz": tz}
    _ingest(fields | {"max_changed_lines": max_changed_lines}, params, set_, out)


@app.command("swebench")
def swebench(
    instances: Annotated[Path, typer.Argument(help="SWE-bench instances (JSON lines or a JSON array)")],
    repo: ReposOpt,
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
    out: OutOpt = None,
) -> None:
    """SWE-bench-style instances; each instance's base_commit is taken from its repository's mirror or clone."""
    _ingest({"kind": "swebench", "path": str(instances), "repos": _repo_map(repo)}, params, set_, out)


@app.command("gitlog")
def gitlog(
    repo: OneRepoOpt,
    rev: RevOpt = "HEAD",
    max_changed_lines: MaxLinesOpt = MAX_CHANGED_LINES,
    issues: Annotated[
        Path | None, typer.Option("--issues", help="the repository's issues and PRs (GitHub REST JSON lines)")
    ] = None,
    params: ParamsOpt = Path("params.yaml"),
    set_: SetOpt = [],  # noqa: B006
    out: OutOpt = None,
) -> None:
    """Commits of a git repository that change code and tests together: the statement is the issue a commit
    links (``--issues``), else its message's body under its subject; commits no one would train on are dropped."""
    name, source = _one_repo(repo)
    fields = {"kind": "gitlog", "repo": source, "repo_name": name, "rev": rev, "max_changed_lines": max_changed_lines}
    _ingest(fields | ({"issues": str(issues)} if issues else {}), params, set_, out)


def _ingest(fields: dict[str, Any], params_path: Path, set_: list[str], out: Path | None) -> None:
    """Build the entry, ingest it, write the task set and print the funnel (a trialforge error exits 1: cli.py)."""
    from trialforge.runtime import store_url
    from trialforge.sandbox.images import cache_root
    from trialforge.store.objstore import open_store

    try:
        entry: Any = TypeAdapter(SourceEntry).validate_python(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:])) or 'entry'}: {e['msg']}" for e in exc.errors())
        raise typer.BadParameter(problems) from None
    params = load_params(params_path, key_values(set_, "--set"))
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


def _repo_map(pairs: list[str]) -> dict[str, str]:
    """``owner/name=PATH_OR_URL`` pairs as a map; each needs its name."""
    repos: dict[str, str] = {}
    for pair in pairs:
        name, source = _split_repo(pair)
        if not name:
            raise typer.BadParameter(f"--repo expects owner/name=PATH_OR_URL, got {pair!r}")
        repos[name] = source
    return repos


def _one_repo(value: str) -> tuple[str, str]:
    """``[NAME=]PATH_OR_URL``: the name may be left out (the last component of the path or URL)."""
    name, source = _split_repo(value)
    if not source:
        raise typer.BadParameter(f"--repo expects [NAME=]PATH_OR_URL, got {value!r}")
    return name, source


def _split_repo(value: str) -> tuple[str, str]:
    """(name, source) of ``NAME=SOURCE``; ("", value) when the text before ``=`` is no repository name (a path
    or URL may hold ``=`` too)."""
    name, sep, source = value.partition("=")
    if sep and _NAME.match(name):
        return name, source
    return "", value
