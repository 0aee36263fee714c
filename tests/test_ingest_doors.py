"""The doors onto every ingestion adapter: `trialforge ingest KIND`, `sources.extra` in params.yaml through
`pipeline.ingest`, and the ingest flow's overrides.

The sources are built at test time: a small git repository with a real history (a root commit, a fix that
changes code and tests, a docs-only commit) and a SWE-bench file whose instances point into it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import get_args

import pytest
import typer
from conftest import REPO_ROOT
from support.cli_runner import invoke

from trialforge import pipeline
from trialforge.cli import app
from trialforge.config import load_params
from trialforge.errors import ConfigError
from trialforge.runtime import open_runtime
from trialforge.store.objstore import open_store
from trialforge.tasks.ingest.sources import SourceEntry, SwebenchFile, ingest_source
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.taskset import read_tasks

STATS_BUGGY = "def total(xs):\n    return sum(xs)\n\n\ndef mean(xs):\n    return sum(xs) / (len(xs) - 1)\n"
STATS_FIXED = STATS_BUGGY.replace("(len(xs) - 1)", "len(xs)")
TEST_TOTAL = "from mylib.stats import total\n\n\ndef test_total():\n    assert total([1, 2]) == 3\n"
TEST_MEAN = TEST_TOTAL.replace("import total", "import mean, total") + (
    "\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n"
)


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Ada Lim",
        "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_COMMITTER_NAME": "Ada Lim",
        "GIT_COMMITTER_EMAIL": "ada@example.com",
        "GIT_AUTHOR_DATE": "2024-03-01T10:00:00+00:00",
        "GIT_COMMITTER_DATE": "2024-03-01T10:00:00+00:00",
    }
    done = subprocess.run(["git", *args], cwd=repo, input=stdin, capture_output=True, env=env, check=True)
    return done.stdout.decode().strip()


def _commit(repo: Path, message: str, files: dict[str, str]) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-F", "-", stdin=message.encode())
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def mylib(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """mylib: root commit (buggy mean), the fix with its test, then a docs-only commit."""
    repo = tmp_path_factory.mktemp("mylib") / "mylib"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shas = {
        "root": _commit(
            repo,
            "Add stats helpers",
            {"mylib/__init__.py": "", "mylib/stats.py": STATS_BUGGY, "tests/test_stats.py": TEST_TOTAL},
        ),
        "fix": _commit(
            repo,
            "mean() divides by one less than the count\n\nmean([1, 2, 3]) returns 3.0 instead of 2.0.",
            {"mylib/stats.py": STATS_FIXED, "tests/test_stats.py": TEST_MEAN},
        ),
        "docs": _commit(repo, "Document the helpers", {"README.md": "# mylib\n"}),
    }
    return repo, shas


def _diff(repo: Path, old: str, new: str, path: str) -> str:
    return _git(repo, "diff", "--no-color", old, new, "--", path) + "\n"


def _instance(repo: Path, shas: dict[str, str], instance_id: str, repo_name: str = "acme/mylib") -> dict:
    return {
        "instance_id": instance_id,
        "repo": repo_name,
        "base_commit": shas["root"],
        "patch": _diff(repo, shas["root"], shas["fix"], "mylib"),
        "test_patch": _diff(repo, shas["root"], shas["fix"], "tests"),
        "problem_statement": "mean([1, 2, 3]) returns 3.0, expected 2.0",
        "FAIL_TO_PASS": ["tests/test_stats.py::test_mean"],
        "PASS_TO_PASS": ["tests/test_stats.py::test_total"],
        "created_at": "2024-03-01T10:00:00Z",
    }


@pytest.fixture(scope="module")
def instances(mylib, tmp_path_factory) -> Path:
    """One good instance, one whose id the git history also gives, one for a repository nobody mapped."""
    repo, shas = mylib
    rows = [
        _instance(repo, shas, "acme__mylib-1"),
        _instance(repo, shas, f"mylib-{shas['fix'][:12]}"),
        _instance(repo, shas, "acme__other-7", repo_name="acme/other"),
    ]
    path = tmp_path_factory.mktemp("swebench") / "instances.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def params_file(tmp_path) -> Path:
    """Library defaults: the demo's params.yaml is not these tests'."""
    path = tmp_path / "params.yaml"
    path.write_text("{}\n")
    return path


def _cli(tmp_path: Path, params_file: Path, *args: str):
    """Run `trialforge ingest ARGS` with this test's store and out dir."""
    return trialforge(tmp_path, params_file, "ingest", *args)


def trialforge(tmp_path: Path, params_file: Path, *args: str):
    """Run `trialforge ARGS` with this test's store and out dir, on the bwrap backend."""
    knobs = ["-S", f"run.store=file://{tmp_path / 'store'}", "-S", f"run.out_dir={tmp_path / 'out'}"]
    return invoke(*args, "--params", str(params_file), *knobs, "-S", "sandbox.backend=bwrap")


# --- the CLI ---------------------------------------------------------------------------------------------


@pytest.mark.pure
def test_cli_gitlog_writes_the_fix_commit_as_a_task_and_reports_the_other_commits(mylib, params_file, tmp_path):
    repo, shas = mylib
    result = _cli(tmp_path, params_file, "gitlog", "--repo", f"mylib={repo}")

    assert result.exit_code == 0, result.output
    written = tmp_path / "out" / "tasks" / "ingested-gitlog.parquet"  # the default --out
    tasks = read_tasks(written)
    assert [(t.task_id, t.repo, t.source.kind) for t in tasks] == [(f"mylib-{shas['fix'][:12]}", "mylib", "git")]
    assert "return sum(xs) / len(xs)" in tasks[0].gold_patch and "def test_mean" in tasks[0].test_patch
    assert open_store(f"file://{tmp_path / 'store'}").exists(f"snapshots/{tasks[0].snapshot}.tar")  # run.store
    lines = result.stdout.splitlines()
    assert lines[0] == "ingest.gitlog: kept 1 of 3"
    assert "  dropped 1 root_commit" in lines and "  dropped 1 no_test_changes" in lines
    assert any(line.startswith(f"  mylib@{shas['docs']}: no_test_changes:") for line in lines)
    assert lines[-1].startswith(f"wrote 1 tasks to {written} (task set ")


@pytest.mark.pure
def test_cli_gitlog_takes_a_clone_url_and_names_the_repository_after_it(mylib, params_file, tmp_path):
    repo, shas = mylib
    out = tmp_path / "cloned.parquet"
    result = _cli(tmp_path, params_file, "gitlog", "--repo", f"file://{repo}", "--out", str(out))

    assert result.exit_code == 0, result.output
    assert [t.task_id for t in read_tasks(out)] == [f"mylib-{shas['fix'][:12]}"]


@pytest.mark.pure
def test_cli_swebench_keeps_usable_instances_and_reports_the_rest(mylib, instances, params_file, tmp_path):
    repo, shas = mylib
    out = tmp_path / "swe.parquet"
    result = _cli(tmp_path, params_file, "swebench", str(instances), "--repo", f"acme/mylib={repo}", "--out", str(out))

    assert result.exit_code == 0, result.output
    tasks = read_tasks(out)
    assert sorted(t.task_id for t in tasks) == sorted(["acme__mylib-1", f"mylib-{shas['fix'][:12]}"])
    assert {t.fail_to_pass[0] for t in tasks} == {"tests/test_stats.py::test_mean"}
    assert result.stdout.splitlines()[0] == "ingest.swebench: kept 2 of 3"
    assert "  dropped 1 unknown_repository" in result.stdout.splitlines()
    assert "instances.jsonl:3: unknown_repository: no mirror or clone URL for repository 'acme/other'" in result.stdout


@pytest.mark.pure
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["swebench", "{missing}", "--repo", "acme/mylib={repo}"], "cannot read {missing} (No such file or directory"),
        (["swebench", "{dir}", "--repo", "acme/mylib={repo}"], "cannot read {dir} (Is a directory"),
        (["gitlog", "--repo", "mylib={missing}"], "mirror of 'mylib' at {missing} does not exist"),
    ],
)
def test_cli_exits_nonzero_naming_an_input_it_cannot_read(mylib, params_file, tmp_path, args, message):
    repo, _ = mylib
    names = {"missing": tmp_path / "nowhere.jsonl", "dir": tmp_path, "repo": repo}
    out = tmp_path / "never.parquet"
    result = _cli(tmp_path, params_file, *[a.format(**names) for a in args], "--out", str(out))

    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and message.format(**names) in result.stderr
    assert not out.exists()


@pytest.mark.pure
def test_cli_refuses_a_repository_map_without_names(instances, params_file, tmp_path):
    result = _cli(tmp_path, params_file, "swebench", str(instances), "--repo", "/srv/mirrors/mylib")

    assert result.exit_code == 2
    words = " ".join(result.output.replace("│", " ").split())  # typer draws the message in a wrapped box
    assert "--repo expects owner/name=PATH_OR_URL, got '/srv/mirrors/mylib'" in words


@pytest.mark.pure
def test_every_field_of_a_source_is_on_its_command_with_the_fields_help():
    """The commands are built from the source models, so a field added to one is on the command line at once."""
    commands = typer.main.get_command(app).commands["ingest"].commands
    for entry in get_args(get_args(SourceEntry)[0]):
        command = commands[get_args(entry.model_fields["kind"].annotation)[0]]
        given = {p.name: p for p in command.params}
        for name, field in entry.model_fields.items():
            if name in ("kind", "repo_name"):  # repo_name: the NAME= of --repo
                continue
            assert field.description and field.description in given[name].help, (command.name, name)
    assert "--min-statement-words" in invoke("ingest", "gitlog", "--help").stdout


# --- params -----------------------------------------------------------------------------------------------


@pytest.mark.pure
@pytest.mark.parametrize(
    ("entry", "named"),
    [
        (
            {"kind": "svn", "repo": "x"},
            "sources.extra.0: Input tag 'svn' found using 'kind' does not match any of the expected tags: "
            "'github', 'github-api', 'jira', 'swebench', 'gitlog', 'synthesize'",
        ),
        ({"repo": "x"}, "sources.extra.0: Unable to extract tag using discriminator 'kind'"),
        ({"kind": "gitlog"}, "sources.extra.0.gitlog.repo: Field required"),
        (
            {"kind": "swebench", "path": "a.jsonl", "repos": {}, "rev": "x"},
            "sources.extra.0.swebench.rev: Extra inputs",
        ),
        ({"kind": "jira", "path": "j.csv", "repo": "r", "tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
    ],
)
def test_a_bad_source_entry_is_a_config_error_naming_it(tmp_path, entry, named):
    path = tmp_path / "params.yaml"
    path.write_text(json.dumps({"sources": {"extra": [entry]}}))

    with pytest.raises(ConfigError) as err:
        load_params(path)
    assert str(path) in str(err.value) and named in str(err.value)


@pytest.mark.pure
def test_sources_default_to_the_demo_with_no_extra_sources():
    sources = load_params(None).sources

    assert (sources.tickets, sources.repos, sources.synthesize) == (
        "tasks_src/tickets/github_issues.jsonl",
        "tasks_src/repos",
        0,
    )
    assert sources.extra == [] and sources.caps.max_tests == 5000


@pytest.mark.pure
@pytest.mark.parametrize(
    "override",
    [
        {"sources.extra": [{"kind": "gitlog", "repo": "../mylib"}]},
        {"sources": {"extra": [{"kind": "gitlog", "repo": "../mylib"}]}},  # a nested override merges too
    ],
)
def test_an_override_adds_extra_sources_and_keeps_the_rest_of_params_yaml(tmp_path, override):
    path = tmp_path / "params.yaml"
    path.write_text("sources:\n  tickets: mine.jsonl\n  synthesize: 2\n")

    sources = load_params(path, override).sources
    assert (sources.tickets, sources.synthesize) == ("mine.jsonl", 2)
    assert [(e.kind, e.repo, e.rev) for e in sources.extra] == [("gitlog", "../mylib", "HEAD")]


@pytest.mark.pure
def test_a_missing_export_named_in_params_is_a_config_error(tmp_path):
    snapshots = SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")
    entry = SwebenchFile(kind="swebench", path=str(tmp_path / "gone.jsonl"), repos={})

    with pytest.raises(ConfigError, match=r"swebench source: cannot read .*gone\.jsonl \(No such file"):
        ingest_source(entry, snapshots, load_params(None).sources.caps)


# --- the pipeline and the flow ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_tickets(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tickets") / "three.jsonl"
    lines = (REPO_ROOT / "tasks_src" / "tickets" / "github_issues.jsonl").read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n")
    return path


def _extra(repo: Path, instances: Path) -> list[dict]:
    return [
        {"kind": "gitlog", "repo": str(repo), "repo_name": "mylib"},
        {"kind": "swebench", "path": str(instances), "repos": {"acme/mylib": str(repo)}},
        {"kind": "gitlog", "repo": f"file://{repo}", "repo_name": "mylib", "rev": "HEAD~1"},
    ]


@pytest.mark.sandbox
def test_pipeline_ingest_adds_every_extra_source_and_drops_task_ids_already_given(
    mylib, instances, three_tickets, tmp_path
):
    repo, shas = mylib
    gitlog_id = f"mylib-{shas['fix'][:12]}"
    params = load_params(
        None,
        {
            "run.store": f"file://{tmp_path / 'store'}",
            "sources.tickets": str(three_tickets),
            "sources.repos": str(REPO_ROOT / "tasks_src" / "repos"),
            "sources.extra": _extra(repo, instances),
        },
    )
    with open_runtime(params) as rt:
        tasks, funnel = pipeline.ingest(rt)

    kinds = {t.task_id: t.source.kind for t in tasks}
    assert len(kinds) == len(tasks) == funnel.kept == 5
    assert [k for k in kinds.values()] == ["github"] * 3 + ["git", "swebench"]
    assert kinds[gitlog_id] == "git" and kinds["acme__mylib-1"] == "swebench"
    assert funnel.dropped == {
        "ingest.gitlog/root_commit": 2,
        "ingest.gitlog/no_test_changes": 1,
        "ingest.swebench/duplicate_task_id": 1,
        "ingest.swebench/unknown_repository": 1,
        "ingest.gitlog/duplicate_task_id": 1,
    }
    assert funnel.seen == funnel.kept + sum(funnel.dropped.values()) == 5 + 6
    dups = [d for d in funnel.details if d["reason"].endswith("duplicate_task_id")]
    assert [d["ref"] for d in dups] == [gitlog_id, gitlog_id]
    assert dups[0]["detail"] == f"swebench {instances}: task {gitlog_id} already came from gitlog mylib@HEAD"
    assert dups[1]["detail"] == f"gitlog mylib@HEAD~1: task {gitlog_id} already came from gitlog mylib@HEAD"


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_ingest_flow_takes_extra_sources_from_its_overrides(prefect_api, mylib, instances, three_tickets, tmp_path):
    from prefect.flows import load_flow_from_entrypoint

    from trialforge.tasks.taskset import INGESTED, read_published

    repo, shas = mylib
    ingest = load_flow_from_entrypoint(f"{REPO_ROOT / 'flows' / 'ingest.py'}:ingest")
    params_path = tmp_path / "params.yaml"
    params_path.write_text("{}\n")
    sources = {
        "tickets": str(three_tickets),
        "repos": str(REPO_ROOT / "tasks_src" / "repos"),
        "extra": _extra(repo, instances)[:1],
    }
    store = f"file://{tmp_path / 'store'}"
    result = ingest(params_path=str(params_path), overrides={"run.store": store, "sources": sources})

    assert result.tasks == 4
    assert result.funnels[0]["dropped"] == {"ingest.gitlog/root_commit": 1, "ingest.gitlog/no_test_changes": 1}
    version, published = read_published(open_store(store), INGESTED, result.version)
    assert version == result.version and len(published) == 4
    assert f"mylib-{shas['fix'][:12]}" in {t.task_id for t in published}


@pytest.mark.pure
def test_a_swebench_instance_gets_the_environment_of_its_environment_setup_commit(tmp_path):
    repo = tmp_path / "envlib"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shas = {
        "root": _commit(repo, "Add stats", {"mylib/__init__.py": "", "mylib/stats.py": STATS_BUGGY}),
        "fix": _commit(repo, "Fix mean", {"mylib/stats.py": STATS_FIXED, "tests/test_stats.py": TEST_MEAN}),
    }
    pyproject = '[project]\nname = "mylib"\nrequires-python = ">=3.12"\ndependencies = ["attrs==23.1.0"]\n'
    setup = _commit(repo, "Pin the environment", {"pyproject.toml": pyproject})
    rows = [
        _instance(repo, shas, "acme__mylib-1") | {"environment_setup_commit": setup, "version": "1.0"},
        _instance(repo, shas, "acme__mylib-2"),  # no setup commit: its base tree decides, in the images step
    ]
    path = tmp_path / "instances.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    snapshots = SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")

    tasks, _ = ingest_source(SwebenchFile(kind="swebench", path=str(path), repos={"acme/mylib": str(repo)}), snapshots,
                             load_params(None).sources.caps)  # fmt: skip
    with_env, without = tasks
    assert with_env.env is not None and (with_env.env.python, with_env.env.requirements) == ("3.13", ("attrs==23.1.0",))
    assert with_env.env.detected_from[-1] == f"environment_setup_commit {setup[:12]} (version 1.0)"
    assert without.env is None
