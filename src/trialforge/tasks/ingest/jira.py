"""Jira CSV exports linked to the commits of a git repository -> tasks.

The CSV is read as Jira writes it (repeated columns for multi-valued fields, quoted multi-line descriptions, dates in
the exporting user's zone: pass ``tz``). A ticket is linked to every non-merge commit whose message names its key,
each link with a confidence; its task comes from its most confident usable link, a single-parent commit changing
code and tests, whose parent is the base state. Oversize input is dropped, never truncated. Confidences and caps:
docs/ingest.md, "Jira".
"""

from __future__ import annotations

import csv
import logging
import re
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import TextIO

from trialforge.errors import RepoError
from trialforge.funnel import IngestFunnel
from trialforge.tasks.ingest.caps import DEFAULT_CAPS, IngestCaps, check_caps
from trialforge.tasks.ingest.extras import with_extras
from trialforge.tasks.ingest.fixes import MAX_CHANGED_LINES, commit_fix
from trialforge.tasks.ingest.git import Mirrors, RepoSource, repo_name_of, rev_list
from trialforge.tasks.ingest.objects import Commit, ObjectReader
from trialforge.tasks.ingest.records import find_undecodable
from trialforge.tasks.ingest.trees import snapshot_at
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore

log = logging.getLogger(__name__)

_KEY = re.compile(r"(?<![A-Za-z0-9_])([A-Z][A-Z0-9_]+-[1-9][0-9]*)(?![0-9])")
_DATE_FORMATS = ("%d/%b/%y %I:%M %p", "%d/%b/%Y %I:%M %p", "%Y-%m-%d %H:%M", "%d/%m/%Y %H:%M")
NOT_FIXED = frozenset(
    {
        "won't fix",
        "won't do",
        "duplicate",
        "cannot reproduce",
        "incomplete",
        "invalid",
        "declined",
        "not a bug",
        "obsolete",
    }
)
POSITION_SCORES = {"at start of subject": 1.0, "in subject": 0.8, "only in body": 0.5}
AMBIGUITY_FACTOR = 0.75
REQUIRED_COLUMNS = ("Issue key", "Summary")
_FIELD_LIMIT_ERROR = "field larger than field limit"  # the csv module's words for a field over its limit


@dataclass(frozen=True)
class Ticket:
    where: str
    key: str
    summary: str
    description: str
    issue_type: str
    status: str
    resolution: str
    created: str
    comments: tuple[tuple[datetime | None, str], ...]


@dataclass(frozen=True)
class Link:
    key: str
    commit: Commit
    confidence: float
    rule: str


def ingest_jira(
    path: Path,
    repo: RepoSource,
    snapshots: SnapshotStore,
    *,
    repo_name: str | None = None,
    rev: str = "HEAD",
    tz: tzinfo = UTC,
    max_changed_lines: int = MAX_CHANGED_LINES,
    clone_dir: Path | None = None,
    caps: IngestCaps = DEFAULT_CAPS,
) -> tuple[list[Task], IngestFunnel]:
    """One task per fixed ticket of ``path`` with a usable linked commit in ``repo`` (reachable from ``rev``).

    The funnel counts tickets (rows); ``links`` lists every ticket -> commit link with its confidence
    and whether it became the task.
    """
    funnel = IngestFunnel("ingest.jira")
    name = repo_name or repo_name_of(repo)
    tickets = read_jira_csv(path, funnel, tz=tz, caps=caps)
    tasks: list[Task] = []
    with Mirrors({name: repo}, clone_dir) as mirrors:
        try:
            local = mirrors.get(name)
        except RepoError as exc:
            for ticket in tickets:
                funnel.drop(ticket.where, exc.reason, str(exc))
            return tasks, funnel
        links = link_tickets(local, rev, {t.key for t in tickets})
        fixes = _FixCache(local, max_changed_lines, caps)
        for ticket in tickets:
            task = _ticket_task(ticket, links.get(ticket.key, []), name, fixes, snapshots, funnel)
            if task is not None:
                tasks.append(task)
                funnel.keep()
    log.info("ingest.jira %s: kept %d of %d", path.name, funnel.kept, funnel.seen, extra={"funnel": funnel.as_dict()})
    return tasks, funnel


# --- the CSV ---------------------------------------------------------------------------------------------


def read_jira_csv(
    path: Path, funnel: IngestFunnel, *, tz: tzinfo = UTC, caps: IngestCaps = DEFAULT_CAPS
) -> list[Ticket]:
    """Tickets of a Jira CSV export; malformed or oversize rows, undecodable text and duplicates go to ``funnel``."""
    tickets: list[Ticket] = []
    keys: set[str] = set()
    with (
        path.open(encoding="utf-8-sig", errors="surrogateescape", newline="") as fh,
        _field_limit(caps.max_record_bytes),
    ):
        lines = _MeasuredLines(fh)
        rows = _rows(path.name, csv.reader(lines, strict=True), funnel, lines, caps.max_record_bytes)
        header = next(rows, None)
        if header is None:
            funnel.drop(f"{path.name}:1", "malformed_row", "no header row")
            return tickets
        columns = _columns(header[1])
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            funnel.drop(header[0], "malformed_row", f"header lacks column(s) {missing}: is this a Jira CSV export?")
            return tickets
        for where, row in rows:
            ticket = _ticket(where, row, header[1], columns, funnel, tz)
            if ticket is not None and ticket.key in keys:
                funnel.drop(where, "duplicate", f"ticket {ticket.key} appears again")
            elif ticket is not None:
                keys.add(ticket.key)
                tickets.append(ticket)
    return tickets


class _MeasuredLines:
    """The file's lines, counting the bytes handed out so far (a row's size is the difference)."""

    def __init__(self, fh: TextIO) -> None:
        self._fh = fh
        self.bytes = 0

    def __iter__(self) -> _MeasuredLines:
        return self

    def __next__(self) -> str:
        line = next(self._fh)
        self.bytes += len(line.encode("utf-8", "surrogateescape"))
        return line


@contextmanager
def _field_limit(limit: int) -> Iterator[None]:
    """The csv module's field-size limit (process-wide, 128 KiB by default) set to ``limit`` meanwhile."""
    before = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(before)


def _rows(
    name: str, reader: Iterator[list[str]], funnel: IngestFunnel, lines: _MeasuredLines, max_bytes: int
) -> Iterator[tuple[str, list[str]]]:
    """(``file:line``, fields) for each non-blank row; a row the csv module cannot parse, or one over
    ``max_bytes``, is dropped."""
    line_num = getattr(reader, "line_num", 0)
    cap = f"{max_bytes:,} (sources.caps.max_record_bytes)"
    while True:
        start, consumed = line_num + 1, lines.bytes
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if _FIELD_LIMIT_ERROR in str(exc):
                funnel.drop(f"{name}:{start}", "oversize_record", f"a field of the row is over {cap}")
            else:
                funnel.drop(f"{name}:{start}", "malformed_row", f"unparseable CSV: {exc}")
            line_num = getattr(reader, "line_num", line_num + 1)
            continue
        line_num = getattr(reader, "line_num", line_num + 1)
        size = lines.bytes - consumed
        if size > max_bytes:
            funnel.drop(f"{name}:{start}", "oversize_record", f"row is {size:,} bytes > {cap}")
            continue
        if any(cell.strip() for cell in row):
            yield f"{name}:{start}", row


def _columns(header: list[str]) -> dict[str, list[int]]:
    columns: dict[str, list[int]] = defaultdict(list)
    for index, title in enumerate(header):
        columns[title.strip()].append(index)
    return dict(columns)


def _ticket(
    where: str, row: list[str], header: list[str], columns: dict[str, list[int]], funnel: IngestFunnel, tz: tzinfo
) -> Ticket | None:
    if len(row) != len(header):
        funnel.drop(where, "malformed_row", f"{len(row)} fields, the header has {len(header)}")
        return None
    bad = next((header[i] for i, cell in enumerate(row) if find_undecodable(cell) is not None), None)
    if bad is not None:
        funnel.drop(where, "bad_encoding", f"column {bad!r} is not valid UTF-8")
        return None

    def first(column: str) -> str:
        return next((row[i] for i in columns.get(column, []) if row[i].strip()), "").strip()

    key = first("Issue key")
    if not _KEY.fullmatch(key) or not first("Summary"):
        funnel.drop(where, "invalid_record", f"issue key {key!r} or summary missing or malformed")
        return None
    comments = tuple(_comment(row[i], tz) for i in columns.get("Comment", []) if row[i].strip())
    created = first("Created")
    parsed = parse_jira_date(created, tz)
    return Ticket(
        where=where,
        key=key,
        summary=first("Summary"),
        description=first("Description"),
        issue_type=first("Issue Type"),
        status=first("Status"),
        resolution=first("Resolution"),
        created=parsed.isoformat() if parsed else created,
        comments=comments,
    )


def _comment(cell: str, tz: tzinfo) -> tuple[datetime | None, str]:
    """Jira writes a comment as ``date;author;body``."""
    parts = cell.split(";", 2)
    if len(parts) == 3 and (when := parse_jira_date(parts[0], tz)) is not None:
        return when, parts[2].strip()
    return None, cell.strip()


def parse_jira_date(text: str, tz: tzinfo = UTC) -> datetime | None:
    """A Jira export date (``06/Feb/24 9:14 AM`` by default, or ISO) in ``tz``; None when unreadable."""
    text = text.strip()
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=tz)
        except ValueError:
            continue
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=tz)


# --- linking ---------------------------------------------------------------------------------------------


def link_tickets(repo: Path, rev: str, keys: set[str]) -> dict[str, list[Link]]:
    """Every ticket key -> its links to the non-merge commits reachable from ``rev``, most confident first."""
    projects = {key.rsplit("-", 1)[0] for key in keys}
    mentions: dict[str, list[tuple[Commit, int]]] = defaultdict(list)
    with ObjectReader(repo) as objects:
        for sha, parents in rev_list(repo, rev):
            if len(parents) > 1:
                continue  # a merge repeats the keys of the branch it merges
            try:
                commit = objects.commit(sha)
            except RepoError:
                continue  # unreadable message: no key can be read from it either
            named = {k for k in _KEY.findall(commit.message) if k.rsplit("-", 1)[0] in projects}
            for key in named & keys:
                mentions[key].append((commit, len(named)))
    links: dict[str, list[Link]] = {}
    for key, found in mentions.items():
        made = [_link(key, commit, n_keys, len(found)) for commit, n_keys in found]
        # most confident first; among equals the later commit (a follow-up usually completes the fix)
        order = {link.commit.sha: i for i, link in enumerate(made)}
        links[key] = sorted(made, key=lambda link: (-link.confidence, -order[link.commit.sha]))
    return links


def link_confidence(position: str, keys_in_commit: int, commits_for_key: int) -> float:
    """The documented rule: a position score, lowered for every other key and every other commit."""
    penalty = AMBIGUITY_FACTOR ** (max(keys_in_commit, 1) - 1 + max(commits_for_key, 1) - 1)
    return round(POSITION_SCORES[position] * penalty, 3)


def key_position(key: str, commit: Commit) -> str:
    if re.match(rf"^[\s\[(]*{re.escape(key)}(?![0-9])", commit.subject):
        return "at start of subject"
    if key in _KEY.findall(commit.subject):
        return "in subject"
    return "only in body"


def _link(key: str, commit: Commit, keys_in_commit: int, commits_for_key: int) -> Link:
    position = key_position(key, commit)
    rule = f"key {position}; {keys_in_commit} key(s) in commit; {commits_for_key} commit(s) for key"
    return Link(key, commit, link_confidence(position, keys_in_commit, commits_for_key), rule)


# --- tasks -----------------------------------------------------------------------------------------------


class _FixCache:
    """Each commit's (code, test) patches or the reason it is unusable, computed once."""

    def __init__(self, repo: Path, max_changed_lines: int, caps: IngestCaps) -> None:
        self.repo = repo
        self.max_changed_lines = max_changed_lines
        self.caps = caps
        self._done: dict[str, tuple[str, str] | RepoError] = {}

    def get(self, commit: Commit) -> tuple[str, str]:
        if commit.sha not in self._done:
            try:
                self._done[commit.sha] = commit_fix(
                    self.repo,
                    commit,
                    max_changed_lines=self.max_changed_lines,
                    max_patch_bytes=self.caps.max_patch_bytes,
                )
            except RepoError as exc:
                self._done[commit.sha] = exc
        result = self._done[commit.sha]
        if isinstance(result, RepoError):
            raise result
        return result


def _ticket_task(
    ticket: Ticket, links: list[Link], repo_name: str, fixes: _FixCache, snapshots: SnapshotStore, funnel: IngestFunnel
) -> Task | None:
    resolution = ticket.resolution.lower()
    if not resolution or resolution == "unresolved":
        funnel.drop(ticket.where, "unresolved", f"{ticket.key} is {ticket.status or 'open'} with no resolution")
        return None
    if resolution in NOT_FIXED:
        funnel.drop(ticket.where, "not_fixed", f"{ticket.key} resolved as {ticket.resolution!r}")
        return None
    if not links:
        funnel.drop(ticket.where, "no_linked_commit", f"no commit message names {ticket.key}")
        return None
    statement = len(ticket.summary) + 2 + len(ticket.description)
    if statement > fixes.caps.max_statement_chars:
        cap = f"{fixes.caps.max_statement_chars:,} (sources.caps.max_statement_chars)"
        funnel.drop(
            ticket.where, "oversize_statement", f"{ticket.key}: summary and description are {statement:,} chars > {cap}"
        )
        return None
    failures: list[RepoError] = []
    for link in links:
        try:
            task = _task(ticket, link, repo_name, fixes, snapshots)
        except RepoError as exc:
            failures.append(exc)
            funnel.link(
                f"{repo_name}-{ticket.key}", ticket.key, link.commit.sha, link.confidence, link.rule, used=False
            )
            continue
        funnel.link(task.task_id, ticket.key, link.commit.sha, link.confidence, link.rule)
        _note_unused(funnel, task.task_id, ticket.key, links[links.index(link) + 1 :])
        return task
    detail = "; ".join(str(exc) for exc in failures)
    funnel.drop(ticket.where, failures[0].reason, f"{ticket.key}: no linked commit is a usable fix: {detail}")
    return None


def _note_unused(funnel: IngestFunnel, task_id: str, key: str, links: list[Link]) -> None:
    for link in links:
        funnel.link(task_id, key, link.commit.sha, link.confidence, link.rule, used=False)


def _task(ticket: Ticket, link: Link, repo_name: str, fixes: _FixCache, snapshots: SnapshotStore) -> Task:
    code, tests = fixes.get(link.commit)
    parent = link.commit.parents[0]
    extras = {"base_commit": parent, "fix_commit": link.commit.sha, "link_rule": link.rule}
    cutoff = link.commit.author_date
    hints = [body for when, body in ticket.comments if when is not None and when < cutoff]
    task = Task(
        task_id=f"{repo_name}-{ticket.key}",
        source=Source(kind="jira", ref=with_extras(ticket.key, extras), link_confidence=link.confidence),
        repo=repo_name,
        problem_statement=f"{ticket.summary}\n\n{ticket.description}".strip(),
        hints="\n".join(hints),
        gold_patch=code,
        test_patch=tests,
        created_at=ticket.created,
    )
    check_caps(task, fixes.caps)
    return task.model_copy(update={"snapshot": snapshot_at(fixes.repo, parent, [tests, code], snapshots)})
