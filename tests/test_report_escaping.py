"""The report renders hostile text inert: a run whose every free-text field (diffs, statements, tool output, task
ids, policy names, reasons, names of families and tiers, the tracking link's ids) carries script tags, a closing
``</textarea>``, attribute-breaking quotes and ``javascript:`` URLs gives a page whose parsed DOM holds only the
page's own elements, scripts and link, and shows each hostile string as text.

The templates autoescape (observe/templating.py); the test holds whichever way a value reaches the page.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from fixtures.observe.runs import R1, episode_row
from plotly.offline import get_plotlyjs

import trialforge
from trialforge.config import Prices
from trialforge.observe.cost import CostRates, run_costs
from trialforge.observe.metrics import load_run
from trialforge.observe.report import Training, report_html
from trialforge.observe.tracking import TrackingLink
from trialforge.store import datasets
from trialforge.store.objstore import open_store
from trialforge.store.records import EPISODE_SCHEMA
from trialforge.tasks.quality_record import Attempt, LeakSpan, QualityRecord
from trialforge.train.health import HealthThresholds

pytestmark = pytest.mark.pure

ATTACK = (
    "<script>alert('s')</script></textarea><img src=x onerror=alert('i')>\" onmouseover=\"alert('q')\" "
    "x=' onfocus='alert(1)' <a href=\"javascript:alert('a')\">click</a></pre><svg onload=alert('v')> "
    "javascript:alert('u') {{ 7 * 7 }}"
)
# The page's own elements: anything else came from the data.
OURS = {"html", "head", "meta", "title", "style", "script", "body", "h1", "h2", "h3", "section", "table", "tr", "th",
        "td", "span", "br", "div", "code", "p", "ul", "li", "b", "pre", "figure", "figcaption", "details", "summary",
        "a"}  # fmt: skip


def hostile(field: str) -> str:
    return f"{field}:{ATTACK}"


class Page(HTMLParser):
    """The DOM as a browser's parser builds it: elements with their attributes, script bodies, and the text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._in: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._in.append(tag)
            self.scripts.append("") if tag == "script" else None

    def handle_endtag(self, tag: str) -> None:
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        if self._in == ["script"]:
            self.scripts[-1] += data
        elif not self._in:
            self.text.append(data)


def _hostile_run(tmp_path: Path) -> tuple[Any, ...]:
    store = open_store(f"file://{tmp_path / 'store'}")
    rows = []
    for spec in R1[0]:
        row = episode_row("rx", 0, spec)
        row |= {
            "episode_id": hostile(f"episode {row['episode_id']}"),
            "task_id": hostile(f"task {row['task_id']}"),
            "policy": hostile(f"policy {row['policy']}"),
            "policy_version": hostile("version"),
            "tier": hostile("tier"),
            "task_set_version": hostile("task set"),
            "backend": hostile("backend"),
            "code_version": hostile("code"),
        }
        if row["status"] != "ok":
            row["cause"] = hostile("cause")
        if row["final_diff"]:
            row["final_diff"] = "+" + hostile("diff")
            row["verifier_report"] = json.dumps({"reason": hostile("verifier")})
            row["integrity_flags"] = json.dumps([hostile("flag")])
        rows.append(row)
    datasets.write_rows(store, "episodes", rows, EPISODE_SCHEMA, partition={"run": "rx", "iteration": "0"}, part="b")
    data = load_run(store, "rx")

    wrong = Attempt(kind=hostile("mutant"), note=hostile("note"), diff=hostile("mutant diff"), reward=1.0, status="ok")
    quality = [
        QualityRecord(
            task_id=hostile("audited task"), gates_run=["weak_tests", "leaks"], skipped={"shortcuts": hostile("skip")},
            verifier_runs=2, verifier_version=hostile("verifier version"), mutants=[wrong], verdict="fail",
            leaks=[LeakSpan(field="problem_statement", kind="expected_value", start=0, end=3,
                            text=hostile("statement"), source="x")],
            failed_gates=["weak_tests", "leaks"], reasons=[hostile("reason")],
        )
    ]  # fmt: skip
    funnel = {
        hostile("stage"): {
            "seen": 2, "kept": 1, "dropped": {hostile("drop"): 1}, "examples": {hostile("drop"): [hostile("output")]},
        }
    }  # fmt: skip
    update = {
        "iteration": 0, "decision": hostile("decision"), "policy_version": hostile("update version"), "loss": 0.5,
        "sampler": {"budget": 2, "exhausted": hostile("exhausted"), "expected_pass_rate": 0.5, "in_band": True},
        "health": {
            "verdicts": [
                {"check": hostile("check"), "value": 1.0, "threshold": 0.5, "status": "refuse",
                 "reason": hostile("gate")},
                {"check": "other", "value": None, "threshold": None, "status": hostile("status"), "reason": ""},
            ],
            "saturation": {hostile("saturated tier"): {"all_zero": 1, "all_one": 0, "groups": 2}},
        },
    }  # fmt: skip
    loop = {"max_staleness": hostile("staleness"), "trainer_idle_fraction": 0.5, "rollout_idle_fraction": 0.25,
            "staleness": [hostile("lag")]}  # fmt: skip
    families = {
        hostile("family"): {
            "tasks": {"train": 1, "eval": 0}, "reachable": 0, "unreachable_reasons": {hostile("unreachable"): 1},
            "train": None, "heldout": None, "learnable": "no: " + hostile("learnable"),
        }
    }  # fmt: skip
    tracking = TrackingLink(
        tracking_uri="http://127.0.0.1:5000", experiment_id=hostile("experiment"), mlflow_run_id=hostile("mlflow")
    )
    rates = CostRates(
        cpus=1.0, memory_gb=1.0, prices=Prices.model_construct(cpu_hour=0.1, currency=hostile("currency"))
    )  # past validation: the page must not rely on it
    cost = run_costs(data.episodes, rates, [update])
    return data, quality, funnel, update, loop, families, tracking, cost


def test_hostile_text_everywhere_in_a_run_stays_text_in_its_report(tmp_path):
    data, quality, funnel, update, loop, families, tracking, cost = _hostile_run(tmp_path)
    html = report_html(data, HealthThresholds(), 8, quality, Training([update], loop), families, funnel, tracking, cost)
    page = Page(html)

    assert {tag for tag, _ in page.elements} <= OURS
    attributes = [(tag, name, value or "") for tag, attrs in page.elements for name, value in attrs.items()]
    assert not [a for a in attributes if a[1].startswith("on")]  # no event handler
    assert not [a for a in attributes if a[2].strip().lower().startswith("javascript:")]
    links = [attrs for tag, attrs in page.elements if tag == "a"]
    assert len(links) == 1 and str(links[0]["href"]).startswith("http://127.0.0.1:5000/#/experiments/")
    assert not [a for a in attributes if a[1] in ("src", "action", "formaction", "srcdoc")]

    # The scripts are plotly.js and one call per drawn chart, the data inside them JSON with < > / escaped.
    charts = [attrs for tag, attrs in page.elements if tag == "figure" and attrs.get("class") != "no-data"]
    assert page.scripts[0] == get_plotlyjs() and len(page.scripts) == 1 + len(charts) > 1
    for script in page.scripts[1:]:
        assert script.strip().startswith("window.PLOTLYENV") and not re.search(r"[<>]", script)
    assert any("policy gold:\\u003cscript\\u003ealert" in script for script in page.scripts[1:])

    # Every hostile string is shown, whole, as text; one in an attribute keeps its quotes inside it.
    text = "".join(page.text)
    for field in ("task t1", "policy gold", "version", "diff", "verifier", "flag", "cause", "backend", "code",
                  "task set", "audited task", "reason", "mutant", "note", "mutant diff", "skip",
                  "verifier version", "stage", "output", "decision", "update version", "exhausted", "check", "gate",
                  "status", "saturated tier", "staleness", "lag", "family", "learnable", "unreachable", "currency",
                  "mlflow"):  # fmt: skip
        assert hostile(field) in text, field
    assert repr(hostile("statement")) in text  # a leaked span is quoted as Python writes it
    cards = [attrs["data-task"] for tag, attrs in page.elements if tag == "div" and "data-task" in attrs]
    assert cards == [hostile("audited task")]
    shown = {attrs["data-episode"] for tag, attrs in page.elements if tag == "div" and "data-episode" in attrs}
    assert len(shown) == 2 and shown <= {hostile(f"episode {e}") for e in ("e01", "e02", "e03", "e05")}
    assert "{{ 7 * 7 }}" in text  # data is never a template


def test_markup_is_made_in_two_reviewed_places_and_no_template_turns_escaping_off():
    """Text reaches the page unescaped only as ``Markup``: made by ``templating.fragment`` (an autoescaped
    template's output) and ``charts._plotly_markup`` (Plotly's output), nowhere else."""
    src = Path(trialforge.__file__).parent
    makers = {str(p.relative_to(src)): p.read_text().count("Markup(") for p in src.rglob("*.py")}
    assert {path: n for path, n in makers.items() if n} == {"observe/templating.py": 1, "observe/charts.py": 1}
    templates = list((src / "observe" / "templates").rglob("*.j2"))
    assert templates and not [t for t in templates if re.search(r"{%-?\s*autoescape|\|\s*safe\b", t.read_text())]
