"""Bug synthesis on a repository the user names: `trialforge synthesize --repo NAME=PATH`, the `synthesize` kind of
`sources.extra` through `pipeline.ingest`, the PR mirror's reverted hunks, and the one-line errors of bad input.

The repository is built here: a tiny library with pytest tests and a history whose one fix commit (``mean``
divided by one less than the count) also adds the test that notices it, so the PR mirror has a hunk to revert.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_ingest_doors import _commit, _git, trialforge

from trialforge import pipeline
from trialforge.config import load_params
from trialforge.errors import ConfigError
from trialforge.runtime import open_runtime
from trialforge.tasks.ingest.prmirror import FAMILY, pr_mirror_mutants
from trialforge.tasks.taskset import read_tasks

STATS_BUGGY = """def total(xs):
    return sum(xs)


def mean(xs):
    return sum(xs) / (len(xs) - 1)


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x
"""
STATS_FIXED = STATS_BUGGY.replace("(len(xs) - 1)", "len(xs)")
TESTS = """from statlib.stats import clamp, total


def test_total():
    assert total([1, 2]) == 3


def test_clamp():
    assert clamp(5, 0, 3) == 3
    assert clamp(-1, 0, 3) == 0
    assert clamp(2, 0, 3) == 2
"""
TESTS_WITH_MEAN = TESTS.replace("import clamp, total", "import clamp, mean, total") + (
    "\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n"
)


@pytest.fixture(scope="module")
def statlib(tmp_path_factory) -> Path:
    """statlib: the library with a buggy mean, its fix with the test that notices, then a docs commit."""
    repo = tmp_path_factory.mktemp("statlib") / "statlib"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    files = {"statlib/__init__.py": "", "statlib/stats.py": STATS_BUGGY, "tests/test_stats.py": TESTS}
    _commit(repo, "Add stats helpers", files)
    message = "mean() divides by one less than the count\n\nmean([1, 2, 3]) returns 3.0 instead of 2.0."
    _commit(repo, message, {"statlib/stats.py": STATS_FIXED, "tests/test_stats.py": TESTS_WITH_MEAN})
    _commit(repo, "Document the helpers", {"README.md": "# statlib\n"})
    return repo


def _synthesize(tmp_path: Path, *args: str):
    """`trialforge synthesize ARGS` with library defaults (the demo's params.yaml is not these tests')."""
    params = tmp_path / "params.yaml"
    params.write_text("{}\n")
    return trialforge(tmp_path, params, "synthesize", *args)


@pytest.mark.pure
def test_the_pr_mirror_reverts_the_code_hunk_of_the_fix_commit_only(statlib):
    sources = {"statlib/stats.py": STATS_FIXED, "statlib/__init__.py": ""}

    mutants, scan = pr_mirror_mutants(statlib, "HEAD", sources)

    assert [(m.family, m.path) for m in mutants] == [(FAMILY, "statlib/stats.py")]
    assert mutants[0].apply(STATS_FIXED) == STATS_BUGGY  # the tree before the fix, in the current file
    assert scan.commits == {"fix": 1, "root_commit": 1, "no_test_changes": 1}


@pytest.mark.pure
def test_a_hunk_whose_context_changed_since_and_whose_file_moved_under_src_is_still_reverted(tmp_path):
    repo = tmp_path / "moved"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _commit(repo, "Add stats", {"statlib/stats.py": STATS_BUGGY, "tests/test_stats.py": TESTS})
    _commit(repo, "Fix mean\n\nIt divided by one less than the count.",
            {"statlib/stats.py": STATS_FIXED, "tests/test_stats.py": TESTS_WITH_MEAN})  # fmt: skip
    (repo / "src").mkdir()
    _git(repo, "mv", "statlib", "src/statlib")
    now = STATS_FIXED.replace("def clamp(x, lo, hi):", "def clamp(x, lo=0, hi=1):")  # the hunk's last context line
    _commit(repo, "Move the package under src/", {"src/statlib/stats.py": now})

    mutants, _ = pr_mirror_mutants(repo, "HEAD", {"src/statlib/stats.py": now})

    assert [m.path for m in mutants] == ["src/statlib/stats.py"]  # 3 lines of context no longer match; fewer do
    assert mutants[0].apply(now) == now.replace("len(xs)", "(len(xs) - 1)")


@pytest.mark.sandbox
def test_cli_synthesize_as_the_docs_print_it_writes_validated_tasks_with_the_pr_mirrors(statlib, tmp_path):
    # as docs/synthesis.md prints it: --repo mylib=/path/to/mylib --count 10 --candidates 6 --families flip_compare
    result = _synthesize(
        tmp_path, "--repo", f"statlib={statlib}", "--count", "10", "--candidates", "6",
        "--families", "flip_compare",
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    written = tmp_path / "out" / "tasks" / "ingested-synthesize.parquet"
    tasks = read_tasks(written)
    assert tasks and all(t.validation.valid and t.repo == "statlib" and t.source.kind == "synthetic" for t in tasks)
    mirrored = [t for t in tasks if t.source.ref.startswith(f"{FAMILY}:")]
    assert len(mirrored) == 1 and mirrored[0].fail_to_pass == ["tests/test_stats.py::test_mean"]
    assert "len(xs)" not in mirrored[0].problem_statement and "test_mean" in mirrored[0].problem_statement
    assert {t.source.ref.split(":")[0] for t in tasks} <= {FAMILY, "flip_compare"}
    lines = result.stdout.splitlines()  # the progress bars, then the funnel
    assert any(line.startswith(f"ingest.synthesize: kept {len(tasks)} of ") for line in lines)
    assert any(line.startswith("  synthesize statlib: screen") for line in lines)
    assert lines[-1].startswith(f"wrote {len(tasks)} tasks to {written} (task set ")


@pytest.mark.sandbox
def test_a_synthesize_entry_of_sources_extra_goes_through_pipeline_ingest(statlib, tmp_path):
    entry = {"kind": "synthesize", "repo": f"file://{statlib}", "repo_name": "stats", "count": 1, "candidates": 2}
    params = load_params(
        None, {"run.store": f"file://{tmp_path / 'store'}", "sources.tickets": None, "sources.extra": [entry]}
    )
    with open_runtime(params) as rt:
        tasks, funnel = pipeline.ingest(rt)

    assert len(tasks) == funnel.kept <= 1 and {t.repo for t in tasks} <= {"stats"}
    assert funnel.seen == 2 and all(reason.startswith("ingest.synthesize/") for reason in funnel.dropped)
    assert funnel.noted["ingest.synthesize/pr_mirror_commits/fix"] == 1


@pytest.mark.sandbox
@pytest.mark.parametrize(
    ("repo", "message"),
    [
        ("{tmp}/nowhere", "error: mirror of 'x' at {tmp}/nowhere does not exist"),
        ("{tmp}", "error: git rev-parse --absolute-git-dir in {tmp} failed: fatal: not a git repository"),
    ],
)
def test_synthesize_names_a_repository_it_cannot_use_in_one_line(tmp_path, repo, message):
    out = tmp_path / "never.parquet"
    result = _synthesize(tmp_path, "--repo", "x=" + repo.format(tmp=tmp_path), "--out", str(out))

    assert result.exit_code == 1
    assert result.stderr.startswith(message.format(tmp=tmp_path)) and len(result.stderr.splitlines()) == 1
    assert not out.exists()


@pytest.mark.pure
def test_a_count_under_one_or_an_unknown_family_is_refused_before_any_work(statlib, tmp_path):
    result = _synthesize(tmp_path, "--repo", str(statlib), "--count", "0")
    assert result.exit_code == 2
    assert "count: Input should be greater than or equal to 1" in " ".join(result.output.replace("│", " ").split())

    path = tmp_path / "extra.yaml"
    path.write_text(json.dumps({"sources": {"extra": [{"kind": "synthesize", "repo": "x", "families": ["nope"]}]}}))
    with pytest.raises(ConfigError, match=r"sources\.extra\.0\.synthesize\.families: .*unknown mutation families"):
        load_params(path)
