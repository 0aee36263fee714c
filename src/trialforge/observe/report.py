"""The run report: one self-contained HTML file, regenerated from the stored episodes alone.

Charts are interactive Plotly figures (``observe.charts``) with plotly.js inline, once: nothing is fetched
from anywhere, so the file opens from ``file://`` on a machine without network and can be mailed or archived
as is. Every number comes from ``observe.metrics``, ``observe.attribution`` and ``observe.quality``: the
report chooses data here, and the templates (``observe/templates``, autoescaped: ``observe.templating``) lay
it out; neither computes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from markupsafe import Markup

from trialforge.curate.tiers import TIERS
from trialforge.observe.attribution import attribute, category_counts
from trialforge.observe.charts import bar_chart, line_chart, plotly_js
from trialforge.observe.cost import CostRates, run_costs
from trialforge.observe.metrics import PASS_REWARD, RunData, load_run, process_metrics, write_text
from trialforge.observe.quality import quality_metrics, read_records
from trialforge.observe.summary import first_to_last
from trialforge.observe.templating import Code, Span, Table, fmt, pct, render
from trialforge.observe.tracking import TrackingLink, read_link
from trialforge.quality.gate import AUDIT_ERROR
from trialforge.store.objstore import ObjectStore
from trialforge.tasks.quality_record import GATES, Attempt, QualityRecord
from trialforge.train.health import HealthThresholds, check_health

SPOT_CHECKS = 8
ATTRIBUTION_ROWS = 200  # per-episode failure rows shown; the counts above them cover all
QUALITY_ROWS = 200  # per-task quality rows shown, failing tasks first; the shares above them cover all
EVIDENCE_CARDS = 30  # failing tasks shown with their reasons and the diff that got through
DIFF_CAP = 20_000  # characters of a final diff shown in the spot check

_LATENCY_TITLES = {"sandbox_s": "Sandbox start", "exec_s": "Tool exec", "verify_s": "Verification"}


def render_report(
    store: ObjectStore,
    run_id: str,
    out_path: Path,
    *,
    thresholds: HealthThresholds | None = None,
    spot_checks: int = SPOT_CHECKS,
    rates: CostRates | None = None,
) -> Path:
    """Read the run (and its task sets' quality records) from ``store``, write its report to ``out_path``
    (atomically) and return the path. ``rates``: what the cost section prices (none: no cost section)."""
    data = load_run(store, run_id)
    quality = read_records(store, sorted(data.episodes["task_set_version"].unique()))
    training, families = read_training(store, run_id), _read_json(store, families_key(run_id))
    funnel = _read_json(store, funnel_key(run_id))
    thresholds, tracking = thresholds or HealthThresholds(), read_link(store, run_id)
    cost = run_costs(data.episodes, rates, training.updates) if rates is not None else None
    html = report_html(data, thresholds, spot_checks, quality, training, families, funnel, tracking, cost)
    out_path = Path(out_path)
    write_text(out_path, html)
    return out_path


def report_html(
    data: RunData,
    thresholds: HealthThresholds,
    spot_checks: int = SPOT_CHECKS,
    quality: Sequence[QualityRecord] = (),
    training: Training | None = None,
    families: dict[str, dict[str, Any]] | None = None,
    funnel: dict[str, dict[str, Any]] | None = None,
    tracking: TrackingLink | None = None,
    cost: dict[str, Any] | None = None,
) -> str:
    """``families`` is ``observe.families.family_metrics``' output; ``funnel`` ``observe.metrics.task_metrics``';
    ``tracking``: the run's MLflow run, linked under the title; ``cost``: ``observe.cost.run_costs``'."""
    metrics = process_metrics(data.episodes, data.steps)
    training = training or Training([], {})
    return render(
        "report.html.j2",
        title=f"trialforge run {data.run_id}",
        plotly_js=plotly_js(),
        tracking=tracking,
        overview=_overview(data, metrics, thresholds),
        funnel=_funnel(funnel or {}),
        quality=_quality(quality),
        curves=_curves(metrics),
        signal=_learning_signal(metrics, training.updates, families or {}),
        training=_training(training),
        distributions=_distributions(metrics),
        attribution=_attribution(attribute(data.episodes), metrics["overall"].get("endings", {})),
        cost=_cost(cost) if cost else None,
        spot_check=_spot_check(data.episodes, spot_checks),
        metrics_json=json.dumps(metrics, indent=2, sort_keys=True),
    )


@dataclass
class Training:
    updates: list[dict[str, Any]]  # what the train step did per iteration (trained or skipped), in order
    loop: dict[str, Any]  # the schedule's staleness and idle fractions (``loop.iteration``)


def loop_key(run_id: str) -> str:
    return f"runs/{run_id}/loop.json"


def families_key(run_id: str) -> str:
    return f"runs/{run_id}/families.json"


def funnel_key(run_id: str) -> str:
    return f"runs/{run_id}/funnel.json"


# ``loop.records.train_record_key``: a serialised TrainResult per iteration (observe sits below loop)
_TRAIN_RECORD = re.compile(r"runs/[^/]+/train-(\d+)\.json")


def read_training(store: ObjectStore, run_id: str) -> Training:
    """The train step's record of each iteration (its ``stats``, with the iteration), and the schedule's record."""
    records = {int(match[1]): key for key in store.list(f"runs/{run_id}/") if (match := _TRAIN_RECORD.fullmatch(key))}
    updates = [
        stats | {"iteration": i}
        for i, key in sorted(records.items())
        if (stats := json.loads(store.get_bytes(key))["stats"]) is not None
    ]
    if not updates:  # runs from before train records kept each update's stats beside its checkpoint
        legacy = [k for k in store.list(f"checkpoints/{run_id}/") if k.endswith(".json")]
        updates = sorted(
            (json.loads(store.get_bytes(k)) for k in legacy),
            key=lambda u: int(str(u["policy_version"]).removeprefix("v")),
        )
    return Training(updates, _read_json(store, loop_key(run_id)))


def _read_json(store: ObjectStore, key: str) -> dict[str, Any]:
    return json.loads(store.get_bytes(key)) if store.exists(key) else {}


# --- sections: each returns what its template (templates/sections/) shows ----------------------------------


def _overview(data: RunData, metrics: dict[str, Any], thresholds: HealthThresholds) -> dict[str, Any]:
    ep = data.episodes
    facts = {
        "episodes": len(ep),
        "iterations": ", ".join(metrics["iterations"]),
        "policies": ", ".join(sorted(ep["policy"].unique())),
        "task set versions": ", ".join(sorted(ep["task_set_version"].unique())),
        "code versions": ", ".join(sorted(ep["code_version"].unique())),
        "backends": ", ".join(sorted(ep["backend"].unique())),
    }
    health_rows = []
    for iteration, m in metrics["iterations"].items():
        health = check_health(m, thresholds)
        verdict = ("good", "healthy") if health.healthy else ("bad", "unhealthy")
        latency = m["latency"]
        health_rows.append(
            [
                iteration,
                m["episodes"],
                pct(m["env_error_rate"]),
                pct(m["verifier_error_rate"]),
                m["retries"],
                _tampered(m["integrity_flags"]),
                pct(m["zero_variance_groups"]["fraction"]),
                fmt(m["throughput"]["episodes_per_s"]) + f" ({m['throughput']['basis']})",
                *(" / ".join(fmt(latency[name][p]) for p in ("p50", "p90", "p99")) for name in _LATENCY_TITLES),
                Span(*verdict, lines=health.reasons),
            ]
        )
    process = Table(
        [
            "iteration",
            "episodes",
            "env errors",
            "verifier errors",
            "retries",
            "tampered runs (reward 0)",
            "zero-variance groups",
            "episodes/s",
            *(f"{t} s p50/p90/p99" for t in _LATENCY_TITLES.values()),
            "health",
        ],
        health_rows,
    )
    return {"facts": facts, "process": process}


def _curves(metrics: dict[str, Any]) -> list[Markup]:
    iterations = metrics["iterations"]

    def curve(key: str) -> dict[str, list[tuple[float, float]]]:
        series: dict[str, list[tuple[float, float]]] = {}
        for i, m in iterations.items():
            for policy, value in m.get(key, {}).items():
                if value is not None:
                    series.setdefault(policy, []).append((int(i), value))
        return series

    ticks = [int(i) for i in iterations]
    charts = [
        line_chart("reward", "Mean reward (ok episodes)", curve("mean_reward"), "iteration", "reward", ticks),
        line_chart("pass_rate", "Pass rate", curve("pass_rate"), "iteration", "pass rate", ticks),
    ]
    by_tier = metrics["overall"].get("pass_rate_by_policy_tier", {})
    tiers = _tier_order({tier for rates in by_tier.values() for tier in rates})
    charts.append(
        bar_chart(
            "pass_rate_by_tier",
            "Pass rate by tier (all iterations)",
            tiers,
            {policy: [rates.get(t) for t in tiers] for policy, rates in sorted(by_tier.items())},
            "tier",
            "pass rate",
            y_max=1.0,
        )
    )
    return charts


def _distributions(metrics: dict[str, Any]) -> list[Markup]:
    overall = metrics["overall"]
    steps = overall["steps_hist"]
    charts = [
        bar_chart(
            "steps_hist",
            "Steps per episode (all iterations)",
            list(steps),
            {"episodes": list(steps.values())},
            "steps",
            "episodes",
        ),
    ]
    hist = overall["reward_hist"]
    labels = [f"{lo:.1f}" for lo in hist["edges"][:-1]]
    charts.append(
        bar_chart(
            "reward_hist",
            "Reward histogram (ok episodes)",
            labels,
            {"episodes": hist["counts"]},
            "bin start",
            "episodes",
        )
    )
    cdf = overall["latency_cdf"]
    for name, title in _LATENCY_TITLES.items():
        points = list(zip(cdf[name], cdf["quantiles"], strict=False))
        charts.append(line_chart(f"cdf_{name}", f"{title} latency CDF", {name: points}, "seconds", "quantile"))
    return charts


_COST_COLUMNS = (
    "sandbox_s", "reserved_cpu_s", "used_cpu_s", "reserved_memory_gb_s", "verify_s", "retries", "tokens", "money",
)  # fmt: skip


def _cost(cost: dict[str, Any]) -> dict[str, Any]:
    overall = cost["overall"]
    if not overall.get("episodes"):
        return {"empty": True}
    unit = overall["currency"]
    bases = ("totals", "per_episode", "per_valid_trajectory", "per_unit_reward")
    per = Table(["", *_COST_COLUMNS], [[b.replace("_", " "), *_cells(overall[b], _COST_COLUMNS)] for b in bases])
    columns = ("episodes", "valid", "sandbox_s", "money", "money_per_valid", "sandbox_s_per_valid")
    tiers = Table(["tier", *columns], [[t, *_cells(g, columns)] for t, g in overall["by_tier"].items()])
    failures = Table(
        ["failure", *columns[:4]], [[c, *_cells(g, columns[:4])] for c, g in overall["by_failure"].items()]
    )
    rows = []
    for i, c in cost["iterations"].items():
        valid, reward = c.get("per_valid_trajectory") or {}, c.get("per_unit_reward") or {}
        rows.append([i, c["episodes"], c.get("valid", 0), fmt(c.get("money")), fmt(valid.get("all_in")),
                     fmt(reward.get("all_in"))])  # fmt: skip
    header = ["iteration", "episodes", "valid", f"money ({unit})", "per valid trajectory", "per unit of reward"]
    return {
        "empty": False,
        "overall": overall,
        "per": per,
        "tiers": tiers,
        "failures": failures,
        "iterations": Table(header, rows),
    }


def _cells(numbers: dict[str, Any], keys: Sequence[str]) -> list[str]:
    return [fmt(numbers.get(k)) for k in keys]


def _attribution(failures: pd.DataFrame, endings: dict[str, dict[str, int]]) -> dict[str, Any]:
    counts = category_counts(failures)
    kinds = failures.groupby(["category", "cause_kind"]).size().reset_index(name="n")
    shown = failures.head(ATTRIBUTION_ROWS)
    columns = ["episode_id", "iteration", "task_id", "policy", "status", "category", "cause"]
    return {
        "failed": len(failures),
        "shown": len(shown),
        "summary": Table(["category", "episodes"], [[c, n] for c, n in counts.items()]),
        "endings": Table(
            ["who answers", "ending", "episodes"],
            [[side, c, n] for side, causes in endings.items() for c, n in causes.items()],
        ),
        "by_cause": Table(["category", "cause", "episodes"], kinds.values.tolist()),
        "episodes": Table(
            ["episode", "iteration", "task", "policy", "status", "category", "cause"], shown[columns].values.tolist()
        ),
    }


def _funnel(stages: dict[str, dict[str, Any]]) -> Table | None:
    """What each task stage kept and dropped, each drop reason with its first examples (the rejection's own lines)."""
    if not stages:
        return None
    rows: list[list[Any]] = []
    for stage, f in stages.items():
        rows.append([stage, f["seen"], f["kept"], "", ""])
        for reason, count in f["dropped"].items():
            rows.append(["", "", "", f"{reason}: {count}", Code(f.get("examples", {}).get(reason, []))])
    return Table(["stage", "seen", "kept", "dropped", "why"], rows)


def _quality(records: Sequence[QualityRecord]) -> dict[str, Any] | None:
    """Share of tasks failing each gate, then every audited task (excluded ones first) with what it failed on."""
    if not records:
        return None
    figures = quality_metrics(records)
    shares = Table(
        ["check", "tasks failing", "share", "of them excluded"],
        [[check, row["tasks"], pct(row["share"]), row["excluded"]] for check, row in figures["failing"].items()],
    )
    ordered = sorted(records, key=lambda r: (r.verdict == "pass", r.task_id))
    shown = ordered[:QUALITY_ROWS]
    rows = Table(
        ["task", "verdict", *GATES, "audit", "verifier runs", "verifier version"],
        [
            [r.task_id, _kept(r), *(_gate_cell(r, g) for g in GATES),
             _audit_cell(r), r.verifier_runs, r.verifier_version]
            for r in shown
        ],
    )  # fmt: skip
    return {
        "figures": figures,
        "shares": shares,
        "host_judged": _host_judged(figures["host_judged"]),
        "tasks": rows,
        "shown": len(shown),
        "total": len(records),
        "evidence": [_quality_card(r) for r in ordered if r.failed_gates][:EVIDENCE_CARDS],
    }


def _host_judged(figures: dict[str, Any]) -> Table:
    """How much of the verdicts the host judges: expected values that never enter the sandbox."""
    rows = [
        ["fail-to-pass tests", figures["fail_to_pass"], figures["fail_to_pass_host_judged"],
         pct(figures["fail_to_pass_share"])],
        ["pass-to-pass tests", figures["pass_to_pass"], figures["pass_to_pass_host_judged"],
         pct(figures["pass_to_pass_share"])],
        ["assertions", figures["assertions"], figures["assertions_host_judged"], pct(figures["assertion_share"])],
    ]  # fmt: skip
    return Table(["graded", "total", "host-judged", "share"], rows)


def _training(training: Training) -> dict[str, Any] | None:
    """Each iteration's train step (a skipped one has no trainer figures; its batch's lag behind the policy
    included), and the schedule's idle time."""
    if not training.updates:
        return None
    lags = training.loop.get("staleness", [])  # one per batch, so per iteration
    rows = []
    for n, u in enumerate(training.updates):
        i = u.get("iteration", n)
        rows.append(
            [i, _decision(u), u["policy_version"], u.get("episodes", "-"), u.get("trained_on", u.get("sequences", "-")),
             u.get("zero_variance_groups", "-"), u.get("excluded_not_ok", "-"), fmt(u.get("loss")),
             fmt(u.get("clip_fraction")), lags[i] if i < len(lags) else ""]
        )  # fmt: skip
    header = ["iteration", "decision", "version after", "episodes", "trained on", "flat groups", "not ok", "loss",
              "clipped", "lag"]  # fmt: skip
    return {"loop": training.loop, "table": Table(header, rows)}


def _learning_signal(
    metrics: dict[str, Any], updates: list[dict[str, Any]], families: dict[str, Any]
) -> dict[str, Any]:
    """Is there anything to learn, and is it learnt: the learner's held-out curve beside its train curve, how each
    batch was drawn, what the learning gate said of it, and which task families the policy can reach at all."""
    return {
        "heldout": _heldout_chart(metrics),
        "updates": bool(updates),  # none recorded: no sampler figures or learning-gate verdicts
        "sampler": _sampler_table(updates),
        "verdicts": _verdicts_table(updates),
        "saturation": _saturation_table(updates),
        "families": _families_table(families),
    }


def _heldout_chart(metrics: dict[str, Any]) -> Markup | None:
    """Train and held-out pass rate of each policy with held-out episodes: only the learner runs the eval round."""
    iterations = metrics["iterations"]
    learners = sorted({p for m in iterations.values() for p in m.get("heldout_pass_rate", {})})
    if not learners:
        return None
    series: dict[str, list[tuple[float, float]]] = {}
    for i, m in iterations.items():
        for policy in learners:
            for label, key in ((f"{policy} train", "pass_rate"), (f"{policy} held-out", "heldout_pass_rate")):
                if (value := m.get(key, {}).get(policy)) is not None:
                    series.setdefault(label, []).append((int(i), value))
    ticks = [int(i) for i in iterations]
    return line_chart("heldout_vs_train", "Pass rate: held-out vs train", series, "iteration", "pass rate", ticks)


_SAMPLER_COLUMNS = {
    "budget": "budget", "drawn": "drawn", "kept": "kept", "dropped (all equal)": "dropped_zero_variance",
    "refills (extra draws)": "extra_draws", "surplus": "surplus", "rounds": "rounds", "band swaps": "band_swaps",
}  # fmt: skip


def _sampler_table(updates: list[dict[str, Any]]) -> Table:
    rows = [
        [u.get("iteration", "-"), _decision(u), *(s.get(key, "-") for key in _SAMPLER_COLUMNS.values()),
         s.get("exhausted") or "-", fmt(s.get("expected_pass_rate")), "yes" if s.get("in_band") else "no"]
        for u in updates
        if (s := u.get("sampler"))
    ]  # fmt: skip
    header = ["iteration", "decision", *_SAMPLER_COLUMNS, "ended short on", "expected pass rate", "in band"]
    return Table(header, rows)


def _verdicts_table(updates: list[dict[str, Any]]) -> Table:
    """Every check of the learning gate per iteration; a warning or a refusal shows its reason."""
    css = {"warn": "warn", "refuse": "bad"}
    rows = [
        [u.get("iteration", "-"), v["check"], fmt(v["value"]), fmt(v["threshold"]),
         Span(css[v["status"]], v["status"], note=v["reason"]) if v["status"] in css else v["status"]]
        for u in updates
        for v in u.get("health", {}).get("verdicts", [])
    ]  # fmt: skip
    return Table(["iteration", "check", "value", "threshold", "verdict"], rows)


def _saturation_table(updates: list[dict[str, Any]]) -> Table:
    """Per tier, the learner's groups whose rewards were all 0 (too hard now) or all 1 (learnt)."""
    saturation = {u.get("iteration", "-"): u.get("health", {}).get("saturation", {}) for u in updates}
    tiers = _tier_order({tier for by_tier in saturation.values() for tier in by_tier})
    rows = [
        [i, *(f"{r['all_zero']} all 0, {r['all_one']} all 1 of {r['groups']}" if (r := by_tier.get(t)) else "-"
              for t in tiers)]
        for i, by_tier in saturation.items()
    ]  # fmt: skip
    return Table(["iteration", *tiers], rows)


def _families_table(families: dict[str, dict[str, Any]]) -> Table | None:
    if not families:
        return None
    css = {"no": "bad", "partly": "warn", "yes": "good"}
    rows = [
        [family, f["tasks"]["train"], f["tasks"]["eval"], f["reachable"],
         "; ".join(f"{reason} ({n})" for reason, n in f["unreachable_reasons"].items()) or "-",
         first_to_last(f["train"]), first_to_last(f["heldout"]),
         Span(css.get(f["learnable"].split(":")[0], ""), f["learnable"])]
        for family, f in families.items()
    ]  # fmt: skip
    header = ["family", "train tasks", "eval tasks", "reachable", "out of reach (tasks)", "train pass rate",
              "held-out pass rate", "learnable"]  # fmt: skip
    return Table(header, rows)


def _decision(update: dict[str, Any]) -> str:
    return update.get("decision", "trained")  # records from before the learning gate: every one was a step


def _gate_cell(record: QualityRecord, gate: str) -> str:
    """What one gate found on one task, in a few words: the first piece of evidence when it failed."""
    if gate not in record.gates_run:
        return f"not run: {record.skipped[gate]}" if gate in record.skipped else "not run"
    if gate == "leaks" and record.leaks:
        span = record.leaks[0]
        return f"FAIL ({len(record.leaks)} spans): {span.kind} {span.text!r} at {span.field}[{span.start}:{span.end}]"
    if gate == "weak_tests" and record.passing_mutants:
        first = record.passing_mutants[0]
        return f"FAIL ({len(record.passing_mutants)} of {record.mutants_tried} wrong fixes): {first.kind}: {first.note}"
    if gate == "shortcuts" and record.solving_shortcuts:
        return "FAIL: " + ", ".join(s.kind for s in record.solving_shortcuts)
    if gate == "underspecified" and record.underspecified:
        return "FAIL: the statement never states " + ", ".join(record.underspecified)
    if AUDIT_ERROR in record.failed_gates:
        return "undecided"  # the control or a verifier run failed: finding nothing proves nothing
    if gate == "weak_tests":
        return f"pass ({record.mutants_tried} wrong fixes)"
    if gate == "shortcuts":
        return f"pass ({len(record.shortcuts)} strategies)"
    return "pass"


def _kept(record: QualityRecord) -> str:
    return "kept" if record.verdict == "pass" else "excluded"


def _audit_cell(record: QualityRecord) -> str:
    errors = [r.split(":", 1)[1].strip() for r in record.reasons if r.startswith(f"{AUDIT_ERROR}:")]
    return "; ".join(errors) or "ok"


def _quality_card(record: QualityRecord) -> dict[str, Any]:
    """A failing task's reasons, and the diff of each kind of wrong fix or shortcut that scored 1."""
    shown: dict[str, Attempt] = {}
    for attempt in [*record.passing_mutants, *record.solving_shortcuts]:
        shown.setdefault(attempt.kind, attempt)
    return {
        "record": record,
        "kept": _kept(record),
        "attempts": [{"kind": a.kind, "note": a.note, "diff": _capped(a.diff)} for a in shown.values()],
    }


def _spot_check(episodes: pd.DataFrame, limit: int) -> dict[str, Any]:
    """High-reward episodes with distinct diffs, flagged ones first, then a stable pseudo-random sample."""
    high = episodes[(episodes["status"] == "ok") & (episodes["reward"] >= PASS_REWARD)]
    distinct = high.drop_duplicates(["task_id", "final_diff"])
    order = distinct.assign(
        _flagged=distinct["integrity_flags"].fillna("[]") != "[]",
        _draw=distinct["episode_id"].map(lambda e: hashlib.sha256(e.encode()).hexdigest()),
    ).sort_values(["_flagged", "_draw"], ascending=[False, True])
    picked = order.head(limit)
    return {
        "picked": len(picked),
        "distinct": len(distinct),
        "passing": len(high),
        "episodes": [_episode_card(row) for row in picked.to_dict("records")],
    }


def _episode_card(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "row": row,
        "iteration": int(row["iteration"]),
        "steps": int(row["steps"]),
        "reason": json.loads(row["verifier_report"] or "{}").get("reason", ""),
        "flags": json.loads(row["integrity_flags"] or "[]"),
        "diff": _capped(row["final_diff"] or ""),
    }


def _tampered(integrity: dict[str, Any]) -> str:
    """Episodes whose graded run was tampered with, and by which evidence (docs/verification.md)."""
    count = integrity.get("tampered_episodes", 0)
    kinds = ", ".join(f"{kind} {n}" for kind, n in integrity.get("tampered_evidence", {}).items())
    return f"{count} ({kinds})" if count else "0"


def _capped(diff: str) -> str:
    cut = f"\n… ({len(diff) - DIFF_CAP} more characters)" if len(diff) > DIFF_CAP else ""
    return diff[:DIFF_CAP] + cut


def _tier_order(tiers: set[str]) -> list[str]:
    known = [t for t in TIERS if t in tiers]
    return known + sorted(tiers - set(known))
