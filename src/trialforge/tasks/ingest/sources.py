"""The ingestion sources params.yaml can name (``sources.extra``), and one function that ingests any of them.

Each entry is a typed record whose ``kind`` picks the adapter (``github``, ``github-api``, ``jira``, ``swebench``,
``gitlog``, ``synthesize``). The CLI (``trialforge ingest KIND``) and the pipeline (``pipeline.ingest``) both build
an entry and call :func:`ingest_source`, so the two doors cannot drift apart: each command's options are the entry's
fields (``OnCommandLine`` where the command line writes one otherwise). docs/ingest.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trialforge.errors import ConfigError
from trialforge.funnel import Funnel
from trialforge.tasks.ingest.caps import IngestCaps
from trialforge.tasks.ingest.fixes import MAX_CHANGED_LINES
from trialforge.tasks.ingest.git import repo_name_of
from trialforge.tasks.ingest.github import ingest_github_issues
from trialforge.tasks.ingest.github_rest import ingest_github_rest
from trialforge.tasks.ingest.gitlog import MIN_STATEMENT_WORDS, ingest_git_history
from trialforge.tasks.ingest.jira import ingest_jira
from trialforge.tasks.ingest.swebench import ingest_swebench
from trialforge.tasks.ingest.synthesized import CANDIDATES_PER_TASK, synthesize_repository
from trialforge.tasks.mutations import FAMILIES
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore

if TYPE_CHECKING:  # tasks.synthesize needs the settings, which need these entries
    from trialforge.tasks.synthesize import Synthesizer


@dataclass(frozen=True)
class OnCommandLine:
    """How ``trialforge ingest KIND`` takes a field where not as ``--FIELD-NAME VALUE``: the command's options are
    built from the entries' fields (name, type, default, description) in ``ingest_cli.py``."""

    argument: bool = False  # the command's positional argument
    flag: str = ""  # the option's name, instead of --FIELD-NAME
    written: str = ""  # how one value is written (a map's field takes one KEY=VALUE per use of its option)
    name_into: str = ""  # a value written ``[NAME=]VALUE``: NAME fills this field, which has no option of its own


ARGUMENT = OnCommandLine(argument=True)
REPOSITORIES = OnCommandLine(flag="--repo", written="owner/name=PATH_OR_URL")


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GithubExport(_Entry):
    """A GitHub issue export with each issue's merged fix (the bundled demo's format)."""

    kind: Literal["github"]
    tickets: Annotated[str, ARGUMENT] = Field(description="issue export with linked fixes (JSON lines)")
    repos: str = Field(description="directory of the fixed repositories, one per issue's repository name")

    def label(self) -> str:
        return f"github {self.tickets}"


class GithubApiExport(_Entry):
    """Merged pull requests that close issues, from a saved GitHub REST API export (JSON lines or array)."""

    kind: Literal["github-api"]
    path: Annotated[str, ARGUMENT] = Field(description="issues and pull requests as the REST API returns them")
    repos: Annotated[dict[str, str], REPOSITORIES] = Field(description="where an instance's repository is")

    def label(self) -> str:
        return f"github-api {self.path}"


class _GitRepository(_Entry):
    """The history of one git repository."""

    repo: Annotated[str, OnCommandLine(written="[NAME=]PATH_OR_URL", name_into="repo_name")] = Field(
        description="the git repository"
    )
    repo_name: str = Field("", description="the tasks' repo name; default: the last component of the path or URL")
    rev: str = Field("HEAD", description="history reachable from this revision")
    max_changed_lines: int = Field(MAX_CHANGED_LINES, ge=1, description="a larger fix is not a task")


class JiraExport(_GitRepository):
    """Fixed Jira tickets, each linked to the commit of REPO that names its key."""

    kind: Literal["jira"]
    path: Annotated[str, ARGUMENT] = Field(description="Jira CSV export")
    tz: str = Field("UTC", description="zone of the export's dates (IANA name): the exporting user's")

    @field_validator("tz")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        _zone(value)
        return value

    def label(self) -> str:
        return f"jira {self.path}"


class SwebenchFile(_Entry):
    """SWE-bench-style instances; each instance's base_commit is taken from its repository's mirror or clone."""

    kind: Literal["swebench"]
    path: Annotated[str, ARGUMENT] = Field(description="SWE-bench instances (JSON lines or a JSON array)")
    repos: Annotated[dict[str, str], REPOSITORIES] = Field(description="where an instance's repository is")

    def label(self) -> str:
        return f"swebench {self.path}"


class GitHistory(_GitRepository):
    """Commits of a git repository that change code and tests together: the statement is the issue a commit
    links (``--issues``), else its message's body under its subject; commits no one would train on are dropped."""

    kind: Literal["gitlog"]
    issues: str = Field("", description="the repository's issues and PRs (GitHub REST JSON lines) its commits may link")
    min_statement_words: int = Field(MIN_STATEMENT_WORDS, ge=0, description="a shorter statement is dropped")
    keep_subject_only: bool = Field(
        False, description="keep commits whose message is only a subject and links no issue (dropped: subject_only)"
    )

    def label(self) -> str:
        return f"gitlog {self.repo_name or repo_name_of(self.repo)}@{self.rev}"


class SynthesizeRepository(_GitRepository):
    """Synthetic bugs in a git repository, validated in its own environment image: the mutation families and the PR
    mirror (single hunks of its real fixes reverted), kept when its own tests notice; statements from the failures."""

    kind: Literal["synthesize"]
    count: int = Field(100, ge=1, description="validated tasks to make at most")
    candidates: int | None = Field(
        None, ge=1, description=f"candidates to screen at most (default: {CANDIDATES_PER_TASK} x count)"
    )
    families: list[str] = Field([], description=f"mutation families (repeatable; default: all: {', '.join(FAMILIES)})")
    pr_mirror: bool = Field(True, description="also revert single hunks of the history's fix commits")

    @field_validator("families")
    @classmethod
    def _known_families(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown mutation families {unknown}; known: {', '.join(FAMILIES)}")
        return value

    def label(self) -> str:
        return f"synthesize {self.repo_name or repo_name_of(self.repo)}@{self.rev}"


SourceEntry = Annotated[
    GithubExport | GithubApiExport | JiraExport | SwebenchFile | GitHistory | SynthesizeRepository,
    Field(discriminator="kind"),
]
KINDS = ("github", "github-api", "jira", "swebench", "gitlog", "synthesize")


def ingest_source(
    entry: SourceEntry,
    snapshots: SnapshotStore,
    caps: IngestCaps,
    env_overrides: Mapping[str, Mapping[str, Any]] | None = None,
    synthesizer: Synthesizer | None = None,
) -> tuple[list[Task], Funnel]:
    """The tasks of one source and its funnel (stage ``ingest.KIND``); a missing input file is a ``ConfigError``.

    ``env_overrides``: params.yaml's ``env.repos``, for the adapters that read a task's environment at ingest
    (a SWE-bench ``environment_setup_commit``; the Python a git-history commit's era needs). ``synthesizer``:
    the sandboxes and settings a ``synthesize`` entry runs with (``Runtime.synthesizer``).
    """
    match entry:
        case GithubExport():
            tasks, funnel = ingest_github_issues(
                _input_file(entry.tickets, entry), Path(entry.repos), snapshots, caps=caps
            )
            funnel.stage = "ingest.github"  # the bundled adapter names its funnel plain "ingest"
            return tasks, funnel
        case GithubApiExport():
            return ingest_github_rest(_input_file(entry.path, entry), entry.repos, snapshots, caps=caps)
        case JiraExport():
            return ingest_jira(
                _input_file(entry.path, entry),
                entry.repo,
                snapshots,
                repo_name=entry.repo_name or None,
                rev=entry.rev,
                tz=_zone(entry.tz),
                max_changed_lines=entry.max_changed_lines,
                caps=caps,
            )
        case SwebenchFile():
            path = _input_file(entry.path, entry)
            return ingest_swebench(path, entry.repos, snapshots, caps=caps, env_overrides=env_overrides)
        case GitHistory():
            return ingest_git_history(
                entry.repo,
                snapshots,
                repo_name=entry.repo_name or None,
                rev=entry.rev,
                max_changed_lines=entry.max_changed_lines,
                issues=_input_file(entry.issues, entry) if entry.issues else None,
                caps=caps,
                min_statement_words=entry.min_statement_words,
                keep_subject_only=entry.keep_subject_only,
                env_overrides=env_overrides,
            )
        case SynthesizeRepository():
            if synthesizer is None:
                raise ConfigError(f"{entry.label()}: synthesis needs sandboxes, and none were given")
            return synthesize_repository(
                entry.repo,
                snapshots,
                synthesizer,
                count=entry.count,
                repo_name=entry.repo_name or None,
                rev=entry.rev,
                candidates=entry.candidates,
                families=entry.families or tuple(FAMILIES),
                pr_mirror=entry.pr_mirror,
                max_changed_lines=entry.max_changed_lines,
            )
    raise ConfigError(f"unknown source kind {getattr(entry, 'kind', entry)!r}; kinds: {', '.join(KINDS)}")


def drop_duplicates(tasks: list[Task], funnel: Funnel, first_seen: dict[str, str], label: str) -> list[Task]:
    """``tasks`` less those whose id an earlier source already gave (``first_seen``: id -> that source's label).

    Each one dropped turns from kept into ``duplicate_task_id`` in ``funnel`` (its own source's), so the
    counts still add up once the funnel is absorbed; the survivors are added to ``first_seen``.
    """
    fresh: list[Task] = []
    for task in tasks:
        earlier = first_seen.get(task.task_id)
        if earlier is None:
            first_seen[task.task_id] = label
            fresh.append(task)
            continue
        funnel.kept -= 1
        funnel.seen -= 1  # drop() counts it again
        funnel.drop(task.task_id, "duplicate_task_id", f"{label}: task {task.task_id} already came from {earlier}")
    return fresh


def _input_file(path: str, entry: _Entry) -> Path:
    """``path`` when it is a readable file; otherwise a ``ConfigError`` naming the source and what to do."""
    file = Path(path)
    try:
        with file.open("rb"):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        where = "" if file.is_absolute() else f", relative to {Path.cwd()}"
        raise ConfigError(
            f"{entry.kind} source: cannot read {file} ({why}{where}): give the path of an existing export file"
        ) from None
    return file


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name such as UTC or Europe/Paris)") from None
