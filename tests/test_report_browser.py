"""The run report in a real browser: headless Chromium opens the file from file://, with networking off,
and we read back what it laid out (a copy of the report gets a hook that records every error from its first
line on, and a probe that measures every Plotly chart once the page has loaded)."""

from __future__ import annotations

import html
import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from fixtures.observe.runs import write_r1

from trialforge.observe.report import render_report
from trialforge.store.objstore import open_store

CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.pure,
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; scripts/setup-system.sh does it)"
    ),
]
WINDOW = (1200, 3200)

# First thing in <head>, before plotly.js: uncaught exceptions (a syntax error included), failed loads, rejected
# promises (Plotly.newPlot returns one) and console.error calls, kept for the probe.
HOOK = """<script>
window.pageErrors = [];
addEventListener("error", e => pageErrors.push(e.message || `failed to load ${e.target.src || e.target.href}`), true);
addEventListener("unhandledrejection", e => pageErrors.push(`unhandled rejection: ${e.reason}`));
const consoleError = console.error;
console.error = (...args) => { pageErrors.push(args.join(" ")); consoleError(...args); };
</script>"""

# Runs a while after load (virtual time: --virtual-time-budget lets the timer fire before the DOM is dumped), so
# the charts have drawn; writes what it measured into the DOM that --dump-dom prints. Hovering a chart's first
# point proves the hover layer works; the drag layer is what zooms.
PROBE = """<script>
addEventListener("load", () => setTimeout(() => {
  const charts = [...document.querySelectorAll("figure[data-chart]")].map(f => {
    const plot = f.querySelector(".js-plotly-plot"), box = (plot || f).getBoundingClientRect();
    const marks = plot ? [...plot.querySelectorAll(".main-svg .trace .point")].filter(m => {
      const b = m.getBBox(); return b.width > 0 || b.height > 0; }) : [];
    if (plot) Plotly.Fx.hover(plot, [{curveNumber: 0, pointNumber: 0}]);
    const chart = {
      kind: f.dataset.chart, width: box.width, height: box.height, marks: marks.length,
      traces: plot ? plot.querySelectorAll(".main-svg g.trace").length : 0,
      hover: plot ? plot.querySelectorAll(".hoverlayer .hovertext").length : 0,
      zoom: plot ? plot.querySelectorAll(".nsewdrag").length : 0,
    };
    if (plot) Plotly.Fx.unhover(plot);
    return chart;
  });
  const spot = document.getElementById("spot-check");
  const probe = {
    charts,
    errors: pageErrors,
    episodes: [...spot.querySelectorAll("[data-episode]")].map(e => e.dataset.episode),
    diff: spot.querySelector("pre").innerText,
    markupInDiffs: spot.querySelectorAll("pre *").length,
    fetched: performance.getEntriesByType("resource").map(r => r.name),
  };
  const out = document.createElement("pre"); out.id = "probe"; out.textContent = JSON.stringify(probe);
  document.body.appendChild(out);
}, 500));
</script>"""


def _chromium(tmp: Path, page: Path, shot: Path) -> str:
    argv = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp / 'profile'}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=5000", f"--screenshot={shot}",
        "--dump-dom", page.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("browser")
    store = open_store(f"file://{tmp / 'store'}")
    write_r1(store)
    report = render_report(store, "r1", tmp / "report.html")
    probed = tmp / "probed.html"
    probed.write_text(report.read_text().replace("<head>", "<head>" + HOOK, 1).replace("</body>", PROBE + "</body>"))
    dom = _chromium(tmp, probed, tmp / "shot.png")
    assert '<pre id="probe">' in dom, "the probe did not run: " + dom[-2000:]
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    text = dom[start : dom.index("</pre>", start)]
    return json.loads(html.unescape(text)), tmp


def test_the_page_renders_without_errors(rendered):
    probe, _ = rendered
    assert probe["errors"] == []


def test_every_chart_is_an_interactive_plot_with_visible_marks(rendered):
    probe, _ = rendered
    assert [(c["kind"], c["traces"]) for c in probe["charts"]] == [
        ("reward", 2), ("pass_rate", 2), ("pass_rate_by_tier", 2), ("steps_hist", 1), ("reward_hist", 1),
        ("cdf_sandbox_s", 1), ("cdf_exec_s", 1), ("cdf_verify_s", 1),
    ]  # one trace per policy in the curves and the tier bars, one otherwise  # fmt: skip
    for chart in probe["charts"]:
        assert chart["width"] > 300 and chart["height"] > 200, chart
        assert chart["marks"] >= 2, chart  # points or bars with a real extent
        assert chart["hover"] >= 1 and chart["zoom"] >= 1, chart


def test_spot_check_lists_episodes_with_their_diffs_as_text(rendered):
    probe, _ = rendered
    assert probe["episodes"][0] == "e03" and set(probe["episodes"]) == {"e03", "e01", "e05", "f03"}
    assert "+assert 1  # <b>x</b>" in probe["diff"]  # shown as text: the browser built no element from it
    assert probe["markupInDiffs"] == 0


def test_the_page_fetches_nothing(rendered):
    probe, _ = rendered
    assert probe["fetched"] == []


def test_the_screenshot_shows_a_full_page(rendered, capsys):
    _, tmp = rendered
    shot = tmp / "shot.png"
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == WINDOW
    assert len(png) > 60_000  # a blank page of this size compresses to well under 20 kB
    with capsys.disabled():
        print(f"\nscreenshot of the rendered report: {shot}")
