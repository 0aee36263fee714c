"""The run report's task-quality section and the quality metrics: every audited task's record, excluded ones too.

The first test goes through the real doors: ``pipeline.quality`` audits two tasks (the leak check needs no
verifier run), its funnel round-trips through JSON as ``out/funnel/quality.json`` does, ``finish_run``
stores the records next to the task set and writes metrics and report, and the CLI rebuilds the report from
the store alone. The others feed hand-built records (one per way a task fails) to the metrics and the report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.observe.runs import R1, episode_row, write_r1
from typer.testing import CliRunner

from trialforge import pipeline
from trialforge.config import load_params
from trialforge.observe.cli import app
from trialforge.observe.metrics import load_run
from trialforge.observe.quality import quality_metrics, read_records
from trialforge.observe.report import report_html
from trialforge.observe.run_report import finish_run
from trialforge.runtime import open_runtime
from trialforge.store import datasets
from trialforge.store.objstore import open_store
from trialforge.store.records import EPISODE_SCHEMA
from trialforge.tasks.host_judged import HostJudged
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.quality_record import Attempt, LeakSpan, QualityRecord
from trialforge.tasks.schema import Source, Task, task_set_version
from trialforge.train.health import HealthThresholds

BUGGY = "def double(value):\n    return value + 1\n"
FIXED = "def double(value):\n    return value * 2\n"
TESTS = "from shop.calc import double\n\n\ndef test_double():\n    assert double(3) == 6\n"


def _section(html: str) -> str:
    return html.split('<section id="quality">', 1)[1].split("</section>", 1)[0]


def _tasks(snapshots, root: Path) -> list[Task]:
    """One fix, two statements: one quotes the fixed line, the other only describes the bug."""
    trees = {kind: root / kind for kind in ("base", "fixed", "tested")}
    for kind, files in (("base", {}), ("fixed", {"shop/calc.py": FIXED}), ("tested", {"tests/test_calc.py": TESTS})):
        for rel, text in {"shop/__init__.py": "", "shop/calc.py": BUGGY, **files}.items():
            (trees[kind] / rel).parent.mkdir(parents=True, exist_ok=True)
            (trees[kind] / rel).write_text(text)
    common = {
        "source": Source(kind="synthetic", ref="test"),
        "repo": "shop",
        "snapshot": snapshots.put(trees["base"]),
        "gold_patch": diff_trees(trees["base"], trees["fixed"]),
        "test_patch": diff_trees(trees["base"], trees["tested"]),
        "fail_to_pass": ["tests/test_calc.py::test_double"],
    }
    return [
        Task(task_id="leaky", problem_statement="double() is off. Replace its body with `return value * 2`.", **common),
        Task(task_id="plain", problem_statement="double() does not double its argument.", **common),
    ]


@pytest.mark.sandbox
def test_an_excluded_tasks_record_reaches_the_stored_records_the_metrics_and_the_report(tmp_path, state_dir):
    """``state_dir`` keeps the runtime's sandbox reaper to this session's sandboxes."""
    params = load_params(
        None,
        {
            "run.store": f"file://{tmp_path / 'store'}",
            "run.out_dir": str(tmp_path / "out"),
            "quality.gates": ["leaks"],
            "quality.enforce": ["leaks"],
            "quality.require_host_judged": False,  # these tasks are built by hand, never validated (calibrated)
        },
    )
    with open_runtime(params) as rt:
        kept, funnel = pipeline.quality(rt, _tasks(rt.snapshots, tmp_path / "trees"))
        assert [t.task_id for t in kept] == ["plain"] and funnel.dropped == {"leaks": 1}
        funnels = [json.loads(json.dumps(funnel.as_dict()))]  # as stages.py stores it and the report stage reads it
        version = task_set_version(kept)
        rows = [episode_row("rq", 0, spec) | {"task_set_version": version} for spec in R1[0]]
        datasets.write_rows(rt.store, "episodes", rows, EPISODE_SCHEMA, partition={"run": "rq", "iteration": "0"},
                            part="batch-0")  # fmt: skip
        metrics = finish_run(rt, "rq", kept, funnels, updates=[], loop={})
        store = rt.store

    assert {r.task_id: r.verdict for r in read_records(store, [version])} == {"leaky": "fail", "plain": "pass"}
    quality = metrics["quality"]
    assert quality["tasks"] == 2 and quality["excluded"] == 1 and quality["verifier_runs"] == 0
    assert quality["failing"]["leaks"] == {"tasks": 1, "share": 0.5, "excluded": 1}
    assert quality["failing"]["weak_tests"] == {"tasks": 0, "share": None, "excluded": 0}  # not run: no share
    assert quality["leak_kinds"]["added_line"] == {"tasks": 1, "share": 0.5}
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["quality"] == quality  # the DVC metrics

    report = tmp_path / "out" / "report.html"
    section = _section(report.read_text())
    assert "2 tasks audited, 1 excluded" in section
    assert '<tr><td>leaks</td><td class="n">1</td><td>50.0%</td>' in section
    leaky_row = section.split("<td>leaky</td>", 1)[1].split("</tr>", 1)[0]
    assert (
        "<td>excluded</td><td>not run</td><td>FAIL (" in leaky_row
        and "added_line &#39;return value * 2&#39;" in leaky_row
    )
    plain_row = section.split("<td>plain</td>", 1)[1].split("</tr>", 1)[0]
    assert plain_row.startswith("<td>kept</td><td>not run</td><td>pass</td>")
    assert section.index("<td>leaky</td>") < section.index("<td>plain</td>")  # excluded tasks first
    assert 'data-task="leaky"' in section and 'data-task="plain"' not in section

    again = tmp_path / "again.html"
    args = ["report", "rq", "--store", store.url, "--out", str(again), "--params", str(tmp_path / "none.yaml")]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert again.read_bytes() == report.read_bytes()  # the records come from the store, not from finish_run


def _attempt(kind: str, note: str, reward: float, diff: str = "", status: str = "ok") -> Attempt:
    return Attempt(kind=kind, note=note, diff=diff, reward=reward, status=status)


GOLD = _attempt("gold", "the gold patch", 1.0)
ALL_GATES = ["weak_tests", "leaks", "shortcuts"]
SKIPPED = "the task had already failed weak_tests, which is enforced"
RECORDS = [
    QualityRecord(
        task_id="weak", gates_run=["weak_tests", "leaks"], skipped={"shortcuts": SKIPPED}, control=GOLD, weak=True,
        verifier_runs=4, verifier_version="v3",
        mutants=[_attempt("partial_revert", "only the hunk at calc.py:2", 1.0, "+<b>kept</b>"),
                 _attempt("flip_compare", "< to <=", 0.0), _attempt("const_return", "return 0", 0.0)],
        verdict="fail", failed_gates=["weak_tests"], reasons=["weak_tests: 1 of 3 wrong fixes score 1 (...)"],
    ),
    QualityRecord(
        task_id="solvable", gates_run=ALL_GATES, control=GOLD, verifier_runs=3, verifier_version="v3",
        shortcuts=[_attempt("const_true", "every return is True", 1.0, "+    return True"),
                   _attempt("delete_body", "pass", 0.0)],
        verdict="fail", failed_gates=["shortcuts"], reasons=["shortcuts: const_true score 1"],
    ),
    QualityRecord(
        task_id="talkative", gates_run=[*ALL_GATES, "underspecified"], control=GOLD, verifier_runs=2,
        verifier_version="v3", underspecified=["LookupError"],
        leaks=[LeakSpan(field="problem_statement", kind="expected_value", start=4, end=6, text="42", source="42")],
        verdict="pass", failed_gates=["leaks", "underspecified"],
        reasons=["leaks: 1 span(s) give the answer away (...)", "underspecified: ... LookupError ..."],
    ),  # leaks and underspecified reported, not enforced: kept
    QualityRecord(
        task_id="broken", gates_run=ALL_GATES, control=_attempt("gold", "the gold patch", 0.0), verifier_runs=1,
        verifier_version="v3", verdict="fail", failed_gates=["audit_error"],
        reasons=["audit_error: the gold patch does not score 1 with the verifier (reward 0.0, ok: failed)"],
    ),
    QualityRecord(task_id="sound", gates_run=ALL_GATES, control=GOLD, verifier_runs=5, verifier_version="v3",
                  mutants=[_attempt("flip_compare", "< to <=", 0.0)], shortcuts=[_attempt("const_true", "", 0.0)]),
]  # fmt: skip


@pytest.mark.pure
def test_quality_metrics_give_the_share_failing_each_gate():
    figures = quality_metrics(RECORDS)
    assert figures["tasks"] == 5 and figures["excluded"] == 3
    assert figures["failing"] == {
        "weak_tests": {"tasks": 1, "share": 0.2, "excluded": 1},
        "leaks": {"tasks": 1, "share": 0.2, "excluded": 0},
        "shortcuts": {"tasks": 1, "share": 0.25, "excluded": 1},  # of the 4 tasks that ran it
        "underspecified": {"tasks": 1, "share": 1.0, "excluded": 0},  # of the one task that ran it
        "audit_error": {"tasks": 1, "share": 0.2, "excluded": 1},
    }
    assert figures["leak_kinds"]["expected_value"] == {"tasks": 1, "share": 0.2}
    assert figures["verifier_runs"] == 15 and figures["verifier_runs_per_task"] == 3.0
    assert quality_metrics([])["failing"]["leaks"]["share"] is None


@pytest.fixture(scope="module")
def r1(tmp_path_factory):
    store = open_store(f"file://{tmp_path_factory.mktemp('quality-report')}")
    write_r1(store)
    return load_run(store, "r1")


@pytest.mark.pure
def test_the_report_shows_each_tasks_finding_and_the_evidence_escaped(r1):
    section = _section(report_html(r1, HealthThresholds(), quality=RECORDS))
    cells = {name: section.split(f"<td>{name}</td>", 1)[1].split("</tr>", 1)[0] for name in ("weak", "sound")}
    assert "FAIL (1 of 3 wrong fixes): partial_revert: only the hunk at calc.py:2" in cells["weak"]
    assert f"<td>not run: {SKIPPED}</td>" in cells["weak"]  # dropped already: its shortcuts were not run
    assert cells["weak"].endswith('<td class="n">4</td><td>v3</td>')  # verifier runs and version
    gates = "<td>pass (1 wrong fixes)</td><td>pass</td><td>pass (1 strategies)</td><td>not run</td><td>ok</td>"
    assert gates in cells["sound"]  # (underspecified: not in its gates_run)
    assert "<td>FAIL: the statement never states LookupError</td>" in section  # reported, the task kept
    assert "<td>FAIL: const_true</td>" in section
    assert "FAIL (1 spans): expected_value &#39;42&#39; at problem_statement[4:6]" in section
    assert "<td>undecided</td>" in section and "the gold patch does not score 1" in section
    order = [section.index(f"<td>{t}</td>") for t in ("broken", "solvable", "weak", "sound", "talkative")]
    assert order == sorted(order)  # excluded first, then kept, each by task id
    evidence = section.split("<h3>Evidence</h3>", 1)[1]
    assert [c.split('"')[0] for c in evidence.split('data-task="')[1:]] == ["broken", "solvable", "weak", "talkative"]
    assert "+&lt;b&gt;kept&lt;/b&gt;" in evidence and "<b>kept</b>" not in evidence  # the passing mutant's diff
    assert "+    return True" in evidence  # the shortcut that solved


@pytest.mark.pure
def test_how_much_the_host_judges_is_summed_over_the_calibrated_tasks_in_the_metrics_and_the_report(r1):
    judged = [
        record.model_copy(update={"host_judged": HostJudged(fail_to_pass=f2p, fail_to_pass_host_judged=host,
                                                            assertions=10, assertions_host_judged=9, weak=1)})
        for record, (f2p, host) in zip(RECORDS[:2], [(3, 3), (1, 0)], strict=True)
    ] + RECORDS[2:]  # fmt: skip
    figures = quality_metrics(judged)["host_judged"]
    assert (figures["fail_to_pass"], figures["fail_to_pass_host_judged"], figures["fail_to_pass_share"]) == (4, 3, 0.75)
    assert (figures["assertion_share"], figures["weak"]) == (0.9, 2)
    assert (figures["tasks_calibrated"], figures["tasks_uncalibrated"]) == (2, 3)
    section = _section(report_html(r1, HealthThresholds(), quality=judged))
    table = section.split("<h3>Judged on the host</h3>", 1)[1]
    assert '<td>fail-to-pass tests</td><td class="n">4</td><td class="n">3</td><td>75.0%</td>' in table
    assert "Over 2 tasks calibrated by validation (3 not calibrated)" in table


@pytest.mark.pure
def test_a_run_without_stored_records_says_so(r1):
    assert "No quality records are stored" in _section(report_html(r1, HealthThresholds()))


@pytest.mark.pure
def test_the_report_shows_why_tasks_were_dropped_with_their_first_error_lines_escaped(r1):
    funnel = {
        "images": {"seen": 3, "kept": 3, "dropped": {}, "examples": {}},
        "validate": {
            "seen": 3, "kept": 1, "dropped": {"collection_error_after_fix": 2},
            "examples": {"collection_error_after_fix": ["t-1: tests/test_x.py: ModuleNotFoundError: No module <pkg>"]},
        },
    }  # fmt: skip
    html = report_html(r1, HealthThresholds(), funnel=funnel)
    section = html.split('<section id="funnel">', 1)[1].split("</section>", 1)[0]
    assert '<td>validate</td><td class="n">3</td><td class="n">1</td>' in section
    assert "<td>collection_error_after_fix: 2</td>" in section
    assert "ModuleNotFoundError: No module &lt;pkg&gt;" in section and "<pkg>" not in section
    assert '<section id="funnel">' not in report_html(r1, HealthThresholds())  # a run stored no funnel: no section
