"""The bundled-ticket adapter: good lines become tasks, bad lines are reported by line number and skipped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from trialforge.store.objstore import open_store
from trialforge.tasks.ingest.caps import IngestCaps
from trialforge.tasks.ingest.github import ingest_github_issues
from trialforge.tasks.patches import apply_patch, diff_trees
from trialforge.tasks.snapshots import SnapshotStore

pytestmark = pytest.mark.pure

TICKETS = REPO_ROOT / "tasks_src" / "tickets" / "github_issues.jsonl"
REPOS = REPO_ROOT / "tasks_src" / "repos"


@pytest.fixture
def snapshots(tmp_path):
    return SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")


def test_bundled_tickets_become_tasks_whose_base_has_the_bug(snapshots, tmp_path):
    tasks, funnel = ingest_github_issues(TICKETS, REPOS, snapshots)
    assert len(tasks) >= 12
    assert funnel.dropped.get("no_linked_fix") == 1  # the issue closed as not planned
    for task in tasks:
        base = snapshots.materialize(task.snapshot)
        assert not list(base.rglob(".git"))
        fixed = tmp_path / "fixed" / task.task_id
        shutil.copytree(base, fixed)
        apply_patch(fixed, task.test_patch)
        apply_patch(fixed, task.gold_patch)
        assert diff_trees(fixed, REPOS / task.repo) == "", f"{task.task_id}: base + fix != the bundled repository"
        assert "tests/" not in task.gold_patch and task.test_patch.count("diff --git a/tests/") >= 1


def test_reingesting_gives_the_same_snapshots(snapshots):
    first, _ = ingest_github_issues(TICKETS, REPOS, snapshots)
    second, _ = ingest_github_issues(TICKETS, REPOS, snapshots)
    assert [t.snapshot for t in first] == [t.snapshot for t in second]
    assert [t.content_hash() for t in first] == [t.content_hash() for t in second]


def test_malformed_line_is_reported_with_its_number_and_the_rest_kept(snapshots, tmp_path):
    lines = TICKETS.read_text().splitlines()
    good = [line for line in lines if json.loads(line).get("fix")][:3]
    bad_json = '{"number": 99, "title": "truncated'
    missing_field = json.dumps({"number": 100, "title": "no body or repo"})
    escaping = json.loads(good[0])
    escaping["number"] = 101
    escaping["fix"]["fix_patch"] = escaping["fix"]["fix_patch"].replace("a/", "a/../../", 1)
    export = tmp_path / "export.jsonl"
    export.write_text("\n".join([good[0], bad_json, good[1], missing_field, json.dumps(escaping), good[2]]) + "\n")
    tasks, funnel = ingest_github_issues(export, REPOS, snapshots)
    assert len(tasks) == 3
    by_reason = {d["reason"]: d for d in funnel.details}
    assert by_reason["malformed_json"]["ref"] == "export.jsonl:2"
    assert "line 2" in by_reason["malformed_json"]["detail"]
    assert by_reason["invalid_record"]["ref"] == "export.jsonl:4"
    assert "escapes" in by_reason["patch_does_not_apply"]["detail"]


def test_unknown_repository_is_reported(snapshots, tmp_path):
    record = json.loads(next(line for line in TICKETS.read_text().splitlines() if '"fix": {' in line))
    record["repository"] = "nosuchrepo"
    export = tmp_path / "one.jsonl"
    export.write_text(json.dumps(record) + "\n")
    tasks, funnel = ingest_github_issues(export, REPOS, snapshots)
    assert tasks == [] and funnel.dropped == {"unknown_repository": 1}


def test_invalid_utf8_is_replaced_not_fatal(snapshots, tmp_path):
    line = next(line for line in TICKETS.read_text().splitlines() if '"fix": {' in line)
    export = tmp_path / "latin1.jsonl"
    export.write_bytes(
        line.replace('"title": "', '"title": "caf\\u00e9 ', 1).encode() + b"\n" + b'{"title": "\xff\xfe"}\n'
    )
    tasks, funnel = ingest_github_issues(export, REPOS, snapshots)
    assert len(tasks) == 1 and funnel.dropped["invalid_record"] == 1
    assert Path(export).exists()


def test_oversize_lines_and_statements_are_dropped_by_line_and_the_rest_kept(snapshots, tmp_path):
    good = [line for line in TICKETS.read_text().splitlines() if '"fix": {' in line][:2]
    long_body = json.loads(good[1])
    long_body["number"], long_body["body"] = 200, "x" * 3_000
    huge = json.loads(good[1])
    huge["number"], huge["body"] = 201, "y" * 50_000
    export = tmp_path / "export.jsonl"
    export.write_text("\n".join([good[0], json.dumps(long_body), json.dumps(huge), good[1]]) + "\n")
    caps = IngestCaps(max_statement_chars=2_000, max_record_bytes=40_000)
    tasks, funnel = ingest_github_issues(export, REPOS, snapshots, caps=caps)
    kept = [json.loads(line)["number"] for line in good]
    assert [t.task_id.rsplit("-", 1)[1] for t in tasks] == [str(n) for n in kept]
    assert [(d["ref"].split(" ")[0], d["reason"]) for d in funnel.details] == [
        ("export.jsonl:2", "oversize_statement"),
        ("export.jsonl:3", "oversize_record"),
    ]
    statement = len(f"{long_body['title']}\n\n{long_body['body']}")
    assert funnel.details[0]["detail"].endswith(
        f"problem statement is {statement:,} chars > 2,000 (sources.caps.max_statement_chars)"
    )
    size = len(json.dumps(huge))
    assert funnel.details[1]["detail"] == f"line 3 is {size:,} bytes > 40,000 (sources.caps.max_record_bytes)"
