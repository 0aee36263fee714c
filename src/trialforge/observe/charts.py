"""The run report's charts: interactive Plotly figures, rendered offline into HTML fragments.

The page carries plotly.js once, inline (``plotly_js``); each chart is a ``<figure data-chart=KIND>``
around a Plotly div and the inline call that draws it, or around a "no data" note when there is nothing
to plot. Nothing is fetched: the file opens from ``file://`` on a machine without network.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import plotly.io as pio
from markupsafe import Markup
from plotly.offline import get_plotlyjs

from trialforge.observe.templating import fragment

HEIGHT = 280  # px; the width follows the page
CONFIG = {"displaylogo": False, "responsive": True}
MAX_TICKS = 10  # iteration labels that fit under a chart


def plotly_js() -> Markup:
    """plotly.js itself (about 4.8 MB): the one script on the page the charts call; put it before them."""
    return _plotly_markup(get_plotlyjs())


def line_chart(
    kind: str,
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    x_label: str,
    y_label: str,
    x_ticks: Sequence[int] = (),
) -> str:
    """One line with point markers per series, in name order; the y axis spans [0, 1] unless the data leave it.
    ``x_ticks`` (iterations) are the only x values labelled, at most about ``MAX_TICKS`` of them."""
    ys = [y for points in series.values() for _, y in points]
    if not ys:
        return no_data(kind, title)
    figure = go.Figure(
        [
            go.Scatter(x=[x for x, _ in series[name]], y=[y for _, y in series[name]], name=name, mode="lines+markers")
            for name in sorted(series)
        ]
    )
    lo, hi = min(0.0, *ys), max(1.0, *ys)
    pad = (hi - lo) * 0.05  # room for the markers on the edges
    figure.update_yaxes(range=[lo - pad, hi + pad])
    if x_ticks:
        figure.update_xaxes(tickvals=list(x_ticks[:: max(1, len(x_ticks) // MAX_TICKS)]))
    return _figure(kind, title, figure, x_label, y_label)


def bar_chart(
    kind: str,
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    x_label: str,
    y_label: str,
    y_max: float | None = None,
) -> str:
    """Grouped bars: one group per category, one bar per series. A missing value (None) leaves a gap; hovering a
    group lists the values it has, so a measured zero reads as one."""
    if not categories or all(v is None for values in series.values() for v in values):
        return no_data(kind, title)
    figure = go.Figure([go.Bar(x=list(categories), y=list(values), name=name) for name, values in series.items()])
    figure.update_layout(barmode="group", hovermode="x", showlegend=len(series) > 1)
    figure.update_xaxes(type="category")
    figure.update_yaxes(rangemode="tozero", range=None if y_max is None else [0, y_max])
    return _figure(kind, title, figure, x_label, y_label)


def no_data(kind: str, title: str) -> Markup:
    """The chart's place on the page when there is nothing to plot: its title and a note, no empty figure."""
    return fragment("chart.html.j2", kind=kind, title=title, plot=None)


_KIND = re.compile(r"[a-z_]+")


def _figure(kind: str, title: str, figure: go.Figure, x_label: str, y_label: str) -> Markup:
    """The figure as an HTML fragment; its div id is the kind, so the same data give the same bytes."""
    figure.update_layout(
        template="plotly_white",
        title={"text": title, "font": {"size": 14}},
        font={"family": "system-ui, sans-serif", "size": 11},
        margin={"l": 55, "r": 20, "t": 40, "b": 45},
        xaxis_title=x_label,
        yaxis_title=y_label,
    )
    if not _KIND.fullmatch(kind):
        raise ValueError(f"a chart kind is a lower-case identifier, not {kind!r}")  # it becomes the div id
    div = pio.to_html(
        figure,
        config=CONFIG,
        include_plotlyjs=False,
        full_html=False,
        default_height=f"{HEIGHT}px",
        div_id=f"chart-{kind}",
    )
    return fragment("chart.html.j2", kind=kind, title=title, plot=_plotly_markup(div))


def _plotly_markup(html: str) -> Markup:
    """The one door for markup no template of ours wrote: Plotly's own output, plotly.js and a figure's div with
    the call that draws it. Reviewed: ``to_html`` writes the figure (titles, series names such as policy names,
    category labels) as JSON with ``<``, ``>`` and ``/`` escaped to ``\\u003c``... (``plotly.io._json._safe``), so
    no text in it can close the script or open a tag; the div id is a chart kind, checked above; the config is
    ours. tests/test_report_escaping.py holds it with hostile policy names."""
    return Markup(html)
