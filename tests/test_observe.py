"""Process metrics, failure attribution, health, metric files, the report and run comparison, computed from
hand-built runs written to a real store (tests/fixtures/observe/runs.py tabulates them; every expected
number below is worked out by hand from that table)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from fixtures.observe.runs import write_r1, write_r2, write_run
from plotly.offline import get_plotlyjs
from typer.testing import CliRunner

from trialforge.config import load_params
from trialforge.errors import TrialforgeError
from trialforge.observe import metrics as m
from trialforge.observe.attribution import CATEGORIES, UnknownStatusError, attribute, category_counts, cause_kind
from trialforge.observe.charts import bar_chart, line_chart
from trialforge.observe.cli import app
from trialforge.observe.compare import MetricDelta, compare_metrics, compare_runs, format_comparison
from trialforge.observe.cost import CostRates
from trialforge.observe.logs import setup_logging
from trialforge.observe.report import render_report
from trialforge.observe.summary import endings_line
from trialforge.store.objstore import ObjectStore, open_store
from trialforge.train.health import (
    Health,
    HealthThresholds,
    UnhealthyBatchError,
    assert_trainable,
    check_health,
)

pytestmark = pytest.mark.pure


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> ObjectStore:
    objects = open_store(f"file://{tmp_path_factory.mktemp('observe-store')}")
    write_r1(objects)
    write_r2(objects)
    return objects


@pytest.fixture(scope="module")
def r1(store) -> dict:
    return m.run_metrics(store, "r1")


@pytest.fixture(scope="module")
def it0(r1) -> dict:
    return r1["iterations"]["0"]


# --- process metrics ------------------------------------------------------------------------------


def test_metrics_are_computed_per_iteration_and_overall(r1):
    assert r1["run_id"] == "r1"
    assert list(r1["iterations"]) == ["0", "1"]
    assert [r1["iterations"][i]["episodes"] for i in ("0", "1")] == [10, 4]
    assert r1["overall"]["episodes"] == 14


def test_env_error_rate_is_split_by_cause_and_verifier_errors_counted_apart(it0):
    assert it0["status_counts"] == {"ok": 5, "env_error": 2, "timeout": 1, "policy_error": 1, "verifier_error": 1}
    assert it0["env_error_rate"] == 0.2  # e06, e10 of 10
    assert it0["env_error_rate_by_cause"] == {"start": 0.1, "died": 0.1}
    assert it0["verifier_error_rate"] == 0.1  # e09


def test_retries_count_attempts_beyond_the_first(it0):
    assert it0["retried_episodes"] == 3  # e04 (attempt 2), e06 (2), e10 (3)
    assert it0["retries"] == 4  # 1 + 1 + 2


def test_termination_reasons_are_counted(it0):
    assert it0["termination"] == {"submitted": 6, "error": 3, "timeout": 1}


def test_every_ending_is_counted_under_who_answers_for_it(store, it0, tmp_path):
    assert it0["endings"] == {
        "model": {"submitted": 5, "submitted_unchanged": 0, "max_turns": 0, "context_exhausted": 0,
                  "invalid_actions": 0},
        "infrastructure": {"sandbox": 2, "inference": 0, "policy_fault": 1, "timeout": 1, "verifier": 1},
    }  # fmt: skip
    assert endings_line(it0["endings"]) == (
        "endings: model (graded) submitted 5; infrastructure (unknown) sandbox 2, policy_fault 1, timeout 1, verifier 1"
    )
    html = render_report(store, "r1", tmp_path / "r1.html").read_text()
    assert "Every ending, by who answers for it" in html
    assert '<td>infrastructure</td><td>policy_fault</td><td class="n">1</td>' in html


def test_latency_percentiles_use_only_stages_that_ran(it0):
    lat = it0["latency"]
    # sandbox: e06 never started (0.0); the other nine are 0.1 .. 0.9 -> p90 = 0.8 + 0.2 * 0.1 (linear)
    assert lat["sandbox_s"] == pytest.approx({"n": 9, "p50": 0.5, "p90": 0.82, "p99": 0.892})
    # exec: run 0.5, view 0.1, replace 0.2, run 1.0; submit and the unknown tool never reach the sandbox
    assert lat["exec_s"] == pytest.approx({"n": 4, "p50": 0.35, "p90": 0.85, "p99": 0.985})
    # verify: graded episodes e01..e05 and e09 -> 1, 2, 3, 4, 5, 6
    assert lat["verify_s"] == pytest.approx({"n": 6, "p50": 3.5, "p90": 5.5, "p99": 5.95})
    cdf = it0["latency_cdf"]
    assert cdf["quantiles"][0] == 0.0 and cdf["quantiles"][-1] == 1.0 and len(cdf["quantiles"]) == 21
    assert (cdf["sandbox_s"][0], cdf["sandbox_s"][-1]) == (0.1, 0.9)
    assert cdf["verify_s"] == sorted(cdf["verify_s"])


def test_steps_and_tool_calls_have_a_mean_and_a_histogram(it0):
    assert it0["steps"] == {"mean": 2.3, "max": 5}  # 3+3+2+2+4+0+5+1+2+1 = 23 over 10
    assert it0["steps_hist"] == {"0": 1, "1": 2, "2": 3, "3": 2, "4": 1, "5": 1}
    assert it0["tool_calls"] == {"mean": 1.7, "max": 5}
    assert it0["tool_calls_hist"] == {"0": 1, "1": 5, "2": 2, "3": 1, "5": 1}


def test_tokens_are_summed_per_policy(it0):
    assert it0["tokens_in"] == {"gold": 10 * 4, "repair": 10 * 6}  # 10 prompt tokens per episode in the fixture
    assert it0["tokens_out"] == {"gold": 5 * 4, "repair": 5 * 6}


def test_pass_rate_counts_policy_failures_but_not_infrastructure_failures(it0):
    # repair answers for e03 (pass), e04 (0.0), e07 (timeout), e08 (policy_error); e09/e10 are infrastructure
    assert it0["pass_rate"] == {"gold": 1.0, "repair": 0.25}
    assert it0["mean_reward"] == {"gold": 1.0, "repair": 0.5}  # ok episodes only
    assert it0["pass_rate_by_tier"] == pytest.approx({"easy": 0.75, "hard": 1 / 3}, abs=1e-6)
    assert it0["pass_rate_by_policy_tier"] == {"gold": {"easy": 1.0, "hard": 1.0}, "repair": {"easy": 0.5, "hard": 0.0}}


def test_reward_histogram_bins_ok_rewards_over_unit_interval(it0):
    hist = it0["reward_hist"]
    assert hist["edges"] == pytest.approx([i / 10 for i in range(11)])
    assert hist["counts"] == [1, 0, 0, 0, 0, 0, 0, 0, 0, 4]  # e04 -> first bin; four 1.0 rewards -> last bin


def test_zero_variance_groups_are_counted_per_iteration_and_policy(r1, it0):
    # iteration 0 ok groups: t1/gold {1, 1} flat, t1/repair {1, 0}, t2/gold {1} flat (e06 is not ok)
    assert it0["zero_variance_groups"] == {
        "groups": 3, "zero_variance": 2, "fraction": 0.666667, "by_policy": {"gold": 1.0, "repair": 0.0},
    }  # fmt: skip
    # overall adds iteration 1's two flat groups: the same task/policy in another iteration is another group
    assert r1["overall"]["zero_variance_groups"]["groups"] == 5
    assert r1["overall"]["zero_variance_groups"]["fraction"] == 0.8


def test_integrity_flags_are_counted_by_kind(it0, r1):
    assert it0["integrity_flags"] == {
        "flagged_episodes": 2,
        "flagged_passes": 1,  # e04's tampered run scored 0
        "counts": {"edits_test_or_config": 1, "tampered": 1},
        "tampered_episodes": 1,
        "tampered_evidence": {"canary_passed": 1, "framework_patched": 1},
    }
    assert r1["iterations"]["1"]["integrity_flags"]["flagged_episodes"] == 0


def test_throughput_from_episode_durations_without_timing(r1, it0):
    assert it0["throughput"] == {"episodes_per_s": 0.5, "basis": "episode_duration"}  # 10 over 10 x 2.0 s
    assert r1["overall"]["throughput"]["episodes_per_s"] == pytest.approx(14 / 24, abs=1e-6)
    assert "idle" not in it0


def test_throughput_and_idle_fractions_from_the_callers_timing(store):
    data = m.load_run(store, "r1")
    timing = {
        0: m.IterationTiming(wall_s=4.0, trainer_idle=0.25, rollout_idle=0.5),
        1: m.IterationTiming(wall_s=2.0, trainer_idle=0.75),
    }
    got = m.process_metrics(data.episodes, data.steps, timing)
    assert got["iterations"]["0"]["throughput"] == {"episodes_per_s": 2.5, "basis": "wall"}
    assert got["iterations"]["0"]["idle"] == {"trainer": 0.25, "rollout": 0.5}
    assert got["iterations"]["1"]["idle"] == {"trainer": 0.75, "rollout": None}
    assert got["overall"]["throughput"] == {"episodes_per_s": pytest.approx(14 / 6, abs=1e-6), "basis": "wall"}
    assert got["overall"]["idle"] == {"trainer": 0.5, "rollout": 0.5}
    partial = m.process_metrics(data.episodes, data.steps, {0: timing[0]})
    assert partial["overall"]["throughput"]["basis"] == "episode_duration"  # iteration 1's wall time is unknown


def test_overall_pools_both_iterations(r1):
    overall = r1["overall"]
    assert overall["env_error_rate"] == pytest.approx(2 / 14, abs=1e-6)
    assert overall["pass_rate"] == {"gold": 1.0, "repair": 0.5}  # repair: e03, f03, f04 pass of six
    assert overall["latency"]["sandbox_s"]["p50"] == pytest.approx(0.3)  # four more 0.1 s starts
    assert r1["iterations"]["1"]["pass_rate"] == {"gold": 1.0, "repair": 1.0}


def test_one_iteration_loads_alone_and_a_missing_run_is_named(store):
    assert set(m.load_run(store, "r1", iteration=1).episodes["episode_id"]) == {"f01", "f02", "f03", "f04"}
    with pytest.raises(m.RunNotFoundError, match=r"'nope'.*check the run id"):
        m.load_run(store, "nope")


def test_summary_metrics_keep_their_keys(store):
    data = m.load_run(store, "r1")
    summary = m.episode_metrics(data.episodes)
    assert summary["pass_rate"] == {"gold": 1.0, "repair": 0.75}
    assert summary["pass_rate_by_iteration"] == {"gold": [1.0, 1.0], "repair": [0.5, 1.0]}
    assert summary["retries"] == 3 and summary["episodes"] == 14


def test_a_run_where_nothing_succeeded_still_measures_and_reports(tmp_path):
    objects = open_store(f"file://{tmp_path / 'store'}")
    broken = {
        0: [
            (eid, task, "repair", "env_error", "start: no engine", "error", None, 2, 0, 0, 0.0, 0.0, 0.5)
            for eid, task in (("b01", "t1"), ("b02", "t2"))
        ]
    }
    write_run(objects, "r3", broken, {})  # no step rows at all
    got = m.run_metrics(objects, "r3")["iterations"]["0"]
    assert got["env_error_rate"] == 1.0 and got["pass_rate"] == {} and got["mean_reward"] == {}
    assert got["zero_variance_groups"] == {"groups": 0, "zero_variance": 0, "fraction": None, "by_policy": {}}
    assert got["latency"]["exec_s"] == {"n": 0, "p50": None, "p90": None, "p99": None}
    assert got["reward_hist"]["counts"] == [0] * 10
    html = render_report(objects, "r3", tmp_path / "r3.html").read_text()
    assert "0 of 0 distinct passing diffs" in html and "<td>b02</td>" in html
    assert html.count("no data") == 6  # reward and pass-rate curves, tiers, the three latency CDFs


# --- attribution ------------------------------------------------------------------------------------


def test_every_failed_episode_gets_exactly_one_category_with_its_cause(store):
    table = attribute(m.load_run(store, "r1").episodes)
    got = {row["episode_id"]: (row["category"], row["cause_kind"]) for row in table.to_dict("records")}
    assert got == {
        "e06": ("environment", "start"),
        "e07": ("timeout", "episode wall time exceeded"),
        "e08": ("policy", "model returned no tool call"),
        "e09": ("verifier", "test_patch_does_not_apply"),
        "e10": ("environment", "died"),
    }
    assert table.loc[table["episode_id"] == "e09", "cause"].item() == "test_patch_does_not_apply: hunk 1"
    assert category_counts(table) == {"policy": 1, "environment": 2, "verifier": 1, "timeout": 1}


def test_category_counts_include_zero_categories_and_ok_runs_have_no_failures(store):
    table = attribute(m.load_run(store, "r1", iteration=1).episodes)
    assert table.empty
    assert category_counts(table) == dict.fromkeys(CATEGORIES.values(), 0)


def test_an_unknown_status_is_refused_not_guessed():
    frame = pd.DataFrame([{"episode_id": "x", "iteration": 0, "task_id": "t", "policy": "p", "status": "crashed",
                           "cause": "boom"}])  # fmt: skip
    with pytest.raises(UnknownStatusError, match="crashed"):
        attribute(frame)


def test_cause_kind_is_the_text_before_the_first_colon():
    assert cause_kind("start: cannot start sandbox tf-1: engine said no") == "start"
    assert cause_kind("") == cause_kind(None) == "unknown"
    assert len(cause_kind("x" * 500)) == 60


# --- health -----------------------------------------------------------------------------------------


def test_verifier_error_rate_above_its_threshold_is_unhealthy(it0):
    health = check_health(it0, HealthThresholds(max_env_error_rate=0.2, max_verifier_error_rate=0.05))
    assert not health.healthy
    assert health.reasons == ["verifier error rate 10.0% exceeds 5.0% (1 of 10 episodes)"]


def test_env_error_rate_above_its_threshold_names_the_causes(it0):
    health = check_health(it0, HealthThresholds(max_env_error_rate=0.15, max_verifier_error_rate=0.5))
    assert health.reasons == ["env error rate 20.0% exceeds 15.0% (by cause: start 10.0%, died 10.0%)"]


def test_rates_at_their_thresholds_are_healthy_and_trainable(it0):
    health = check_health(it0, HealthThresholds(max_env_error_rate=0.2, max_verifier_error_rate=0.1))
    assert health == Health(True, [])
    assert_trainable(health)  # does not raise


def test_an_empty_batch_is_unhealthy():
    assert check_health({"episodes": 0}, HealthThresholds()) == Health(False, ["the batch has no episodes"])


def test_assert_trainable_raises_a_trialforge_error_with_the_reasons(it0):
    health = check_health(it0, HealthThresholds())
    with pytest.raises(UnhealthyBatchError, match=r"verifier error rate 10\.0% exceeds 5\.0%") as caught:
        assert_trainable(health)
    assert isinstance(caught.value, TrialforgeError)
    assert caught.value.reasons == health.reasons


# --- logs -----------------------------------------------------------------------------------------


@pytest.fixture
def json_log():
    root = logging.getLogger()
    level = root.level
    buffer = io.StringIO()
    handler = setup_logging(logging.INFO, stream=buffer)
    yield buffer
    root.removeHandler(handler)
    root.setLevel(level)


def test_structured_logs_are_json_lines_with_their_extra_fields(json_log, it0):
    setup_logging(logging.INFO, stream=json_log)  # idempotent: a second call replaces, never duplicates
    logging.getLogger("trialforge.test").info("published part", extra={"dataset": "episodes", "rows": 3})
    with pytest.raises(UnhealthyBatchError):
        assert_trainable(check_health(it0, HealthThresholds()))  # a refused batch is logged with its reasons
    try:
        raise ValueError("bad")
    except ValueError:
        logging.getLogger("trialforge.test").exception("failed")
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    assert len(lines) == 3
    assert lines[0] | {"ts": None} == {
        "ts": None, "level": "info", "logger": "trialforge.test", "msg": "published part", "dataset": "episodes",
        "rows": 3,
    }  # fmt: skip
    assert lines[1]["msg"] == "refusing an unhealthy batch" and lines[1]["level"] == "error"
    assert lines[1]["reasons"] == ["verifier error rate 10.0% exceeds 5.0% (1 of 10 episodes)"]
    assert "ValueError: bad" in lines[2]["exc"]


# --- metric files -----------------------------------------------------------------------------------


def test_write_metrics_writes_metrics_json_and_dvc_plot_files(tmp_path, r1):
    written = m.write_metrics(tmp_path, r1)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "metrics.json", "plots/latency_cdf.csv", "plots/pass_rate.csv", "plots/reward_hist.csv",
        "plots/steps_hist.csv",
    ]  # fmt: skip
    assert json.loads((tmp_path / "metrics.json").read_text()) == json.loads(json.dumps(r1))
    pass_rate = pd.read_csv(tmp_path / "plots" / "pass_rate.csv")
    assert pass_rate.values.tolist() == [
        [0, "gold", "train", 1.0], [0, "repair", "train", 0.25], [1, "gold", "train", 1.0], [1, "repair", "train", 1.0],
    ]  # fmt: skip
    reward = pd.read_csv(tmp_path / "plots" / "reward_hist.csv")
    assert list(reward.columns) == ["iteration", "bin_lo", "bin_hi", "count"] and len(reward) == 20
    assert reward[reward["iteration"] == 0]["count"].tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 0, 4]
    steps = pd.read_csv(tmp_path / "plots" / "steps_hist.csv")
    assert steps[steps["iteration"] == 1].values.tolist() == [[1, 2, 4]]
    cdf = pd.read_csv(tmp_path / "plots" / "latency_cdf.csv")
    assert list(cdf.columns) == ["quantile", "sandbox_s", "exec_s", "verify_s"] and len(cdf) == 21
    assert cdf.iloc[0].tolist() == pytest.approx([0.0, 0.1, 0.1, 1.0])  # the fastest of each
    assert cdf.iloc[-1].tolist() == pytest.approx([1.0, 0.9, 1.0, 6.0])  # the slowest of each


# --- the report -------------------------------------------------------------------------------------


def _section(html: str, anchor: str) -> str:
    return html.split(f'<section id="{anchor}">', 1)[1].split("</section>", 1)[0]


@pytest.fixture(scope="module")
def report(store, tmp_path_factory) -> Path:
    """The report as `trialforge run` and `trialforge report` write it: costs at the params' rates (defaults here)."""
    rates = CostRates.from_params(load_params(None))
    return render_report(store, "r1", tmp_path_factory.mktemp("report") / "report.html", rates=rates)


def test_report_draws_every_chart_and_attributes_every_failure(report):
    html = report.read_text()
    charts = re.findall(r'<figure data-chart="([a-z_]+)"><div [^>]*>\s*<div id="chart-\1" class="plotly', html)
    assert charts == ["reward", "pass_rate", "pass_rate_by_tier", "steps_hist", "reward_hist", "cdf_sandbox_s",
                      "cdf_exec_s", "cdf_verify_s"]  # fmt: skip
    assert 'class="no-data"' not in html
    assert html.count('"mode":"lines+markers"') == 2 + 2 + 3  # two policies in each curve, one line per latency CDF
    attribution = _section(html, "attribution")
    assert [f"<td>{e}</td>" in attribution for e in ("e06", "e07", "e08", "e09", "e10")] == [True] * 5
    assert "<td>e01</td>" not in attribution
    assert "unhealthy" in _section(html, "overview")  # iteration 0: verifier errors 10% > 5%
    assert "<td>1 (canary_passed 1, framework_patched 1)</td>" in _section(html, "overview")  # e04 tampered


def test_report_is_self_contained(report):
    html = report.read_text()
    assert html.count(get_plotlyjs()) == 1  # plotly.js inline, once
    ours = html.replace(get_plotlyjs(), "")
    assert not re.search(r"(src|href)\s*=|https?://|<link|@import|url\(", ours)
    assert set(re.findall(r"<script[^>]*>", ours)) == {"<script>"}  # inline: plotly.js and the calls that draw


def test_a_chart_with_nothing_to_plot_says_so_without_an_empty_figure():
    empty = [
        line_chart("cdf_exec_s", "Tool exec <latency>", {}, "seconds", "quantile"),
        bar_chart("pass_rate_by_tier", "by tier", ["easy"], {"gold": [None]}, "tier", "pass rate"),
    ]
    assert empty[0] == (
        '<figure data-chart="cdf_exec_s" class="no-data"><figcaption>Tool exec &lt;latency&gt;</figcaption>'
        "<p>no data</p></figure>"
    )
    assert 'class="no-data"' in empty[1] and "Plotly" not in "".join(empty)


def test_spot_check_lists_distinct_passing_diffs_flagged_first_and_escaped(store, report, tmp_path):
    spot = _section(render_report(store, "r1", tmp_path / "report.html", spot_checks=2).read_text(), "spot-check")
    assert "2 of 4 distinct passing diffs (8 passing episodes)" in spot
    shown = re.findall(r'data-episode="(\w+)"', spot)
    assert len(shown) == 2 and shown[0] == "e03"  # the integrity-flagged pass comes first
    assert "edits_test_or_config:tests/test_core.py" in spot
    assert "&lt;b&gt;x&lt;/b&gt;" in spot and "<b>x</b>" not in spot
    everything = _section(report.read_text(), "spot-check")
    assert set(re.findall(r'data-episode="(\w+)"', everything)) == {"e03", "e01", "e05", "f03"}


def test_cli_regenerates_the_report_identically_from_the_store_alone(store, report, tmp_path):
    out = tmp_path / "again.html"
    args = ["report", "r1", "--store", store.url, "--out", str(out), "--params", str(tmp_path / "none.yaml")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert out.as_uri() in result.output
    assert out.read_bytes() == report.read_bytes()  # same stored data, same report

    missing = CliRunner().invoke(app, [*args[:1], "r9", *args[2:]])
    assert missing.exit_code == 1 and "no episodes of run 'r9'" in missing.output


# --- comparison ---------------------------------------------------------------------------------------


def test_compare_runs_gives_deltas_per_metric(store):
    rows = {r.metric: r for r in compare_runs(store, "r1", "r2")}
    assert rows["episodes"] == MetricDelta("episodes", 14, 4, -10)
    assert rows["env_error_rate"].a == pytest.approx(2 / 14, abs=1e-6) and rows["env_error_rate"].b == 0.25
    assert rows["env_error_rate"].delta == pytest.approx(0.25 - 2 / 14, abs=1e-5)
    assert rows["pass_rate.repair"] == MetricDelta("pass_rate.repair", 0.5, 0.5, 0.0)
    assert rows["final.pass_rate.repair"] == MetricDelta("final.pass_rate.repair", 1.0, 0.5, -0.5)  # last iteration
    assert rows["env_error_rate_by_cause.died"] == MetricDelta("env_error_rate_by_cause.died", pytest.approx(1 / 14,
                                                               abs=1e-6), None, None)  # fmt: skip
    assert not any(name.startswith(tuple(m.DISTRIBUTIONS)) for name in rows)


def test_compare_table_prints_one_aligned_line_per_metric():
    a = {"iterations": {"0": {"pass_rate": {"p": 0.25}}}, "overall": {"episodes": 10, "rate": 0.5}}
    b = {"iterations": {"0": {"pass_rate": {"p": 0.75}}}, "overall": {"episodes": 12, "rate": None}}
    text = format_comparison(compare_metrics(a, b), "run-a", "run-b")
    assert text.splitlines() == [
        "metric             run-a  run-b  delta",
        "-----------------  -----  -----  -----",
        "episodes              10     12     +2",
        "rate                 0.5      -      -",
        "final.pass_rate.p   0.25   0.75   +0.5",
    ]


def test_cli_compare_prints_the_deltas(store, tmp_path):
    url = store.url
    result = CliRunner().invoke(app, ["compare", "r1", "r2", "--store", url, "--params", str(tmp_path / "x.yaml")])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("final.pass_rate.repair "))
    assert line.split()[1:] == ["1", "0.5", "-0.5"]


def test_report_path_defaults_under_out_dir(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text(f"run:\n  store: {store.url}\n  out_dir: results\n")
    result = CliRunner().invoke(app, ["report", "r2", "--params", str(params)])
    assert result.exit_code == 0, result.output
    assert Path(tmp_path / "results" / "report-r2.html").is_file()


def test_dvc_plots_show_reads_the_plot_files_as_dvc_yaml_declares_them(tmp_path, r1):
    """docs/observability.md: `dvc plots show` draws out/plots/*.csv as dvc.yaml declares them (real dvc)."""
    m.write_metrics(tmp_path / "out", r1)
    declared = yaml.safe_load((Path(__file__).parents[1] / "dvc.yaml").read_text())["plots"]
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"plots": declared}))
    dvc = [str(Path(sys.executable).with_name("dvc"))]
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=tmp_path, check=True, env=env)
    shown = subprocess.run([*dvc, "plots", "show", "--json"], cwd=tmp_path, check=True, env=env, capture_output=True)
    plots = json.loads(shown.stdout)["data"]
    pass_rate = next(v for k, v in plots.items() if k.endswith("pass_rate.csv"))
    rows = [r for spec in pass_rate for r in spec["content"]["data"]["values"]]
    assert {(int(r["iteration"]), r["policy"], float(r["pass_rate"])) for r in rows} >= {(0, "repair", 0.25)}
    assert any(k.endswith("latency_quantiles") for k in plots) and len(plots) == 4
