"""The run report in a real browser: headless Chromium opens the file from file://, with networking off,
and we read back what it laid out (a probe script appended to a copy of the report measures every chart)."""

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
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; scripts/setup-system.sh does it)"
)
WINDOW = (1200, 3200)

# Runs after the report has been parsed and laid out; writes what it measured into the DOM that --dump-dom prints.
PROBE = """<script>
const charts = [...document.querySelectorAll("figure[data-chart]")].map(f => {
  const svg = f.querySelector("svg"), box = svg.getBoundingClientRect();
  const marks = [...svg.querySelectorAll("rect, circle, polyline")].filter(m => {
    const b = m.getBBox(); return b.width > 0 || b.height > 0; });
  return {kind: f.dataset.chart, width: box.width, height: box.height, marks: marks.length};
});
const spot = document.getElementById("spot-check");
const probe = {
  charts,
  episodes: [...spot.querySelectorAll("[data-episode]")].map(e => e.dataset.episode),
  diff: spot.querySelector("pre").innerText,
  markupInDiffs: spot.querySelectorAll("pre *").length,
  fetched: performance.getEntriesByType("resource").map(r => r.name),
};
const out = document.createElement("pre"); out.id = "probe"; out.textContent = JSON.stringify(probe);
document.body.appendChild(out);
</script>"""


def _chromium(tmp: Path, page: Path, shot: Path) -> str:
    argv = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp / 'profile'}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={shot}", "--dump-dom", page.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("browser")
    store = open_store(f"file://{tmp / 'store'}")
    write_r1(store)
    report = render_report(store, "r1", tmp / "report.html")
    probed = tmp / "probed.html"
    probed.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium(tmp, probed, tmp / "shot.png")
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    text = dom[start : dom.index("</pre>", start)]
    return json.loads(html.unescape(text)), tmp


def test_every_chart_is_laid_out_with_visible_marks(rendered):
    probe, _ = rendered
    assert [c["kind"] for c in probe["charts"]] == [
        "reward", "pass_rate", "pass_rate_by_tier", "steps_hist", "reward_hist", "cdf_sandbox_s", "cdf_exec_s",
        "cdf_verify_s",
    ]  # fmt: skip
    for chart in probe["charts"]:
        assert (chart["width"], chart["height"]) == (520, 250), chart
        assert chart["marks"] >= 2, chart  # bars, points or lines with a real extent (plus legend swatches)


def test_spot_check_lists_episodes_with_their_diffs_as_text(rendered):
    probe, _ = rendered
    assert probe["episodes"][0] == "e03" and set(probe["episodes"]) == {"e03", "e01", "e05", "f03"}
    assert "+assert 1  # <b>x</b>" in probe["diff"]  # shown as text: the browser built no element from it
    assert probe["markupInDiffs"] == 0


def test_the_page_fetches_nothing(rendered):
    probe, _ = rendered
    assert probe["fetched"] == []


def test_the_screenshot_shows_a_full_page(rendered):
    _, tmp = rendered
    png = (tmp / "shot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == WINDOW
    assert len(png) > 60_000  # a blank page of this size compresses to well under 20 kB
