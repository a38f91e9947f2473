"""The run report's page (:mod:`keras_dl.report.build`) and the scaling study's
(:mod:`keras_dl.report.scaling`): line and bar charts as inline SVG, tables, sections
and the stylesheet. No JavaScript, no library, nothing fetched. Every label and cell is
HTML-escaped, so a metric, table or tag value from the data is shown as text and never runs.

Each series is one ``<path class="series" data-series="NAME">`` with a point per value, so a
test (or a person with the browser's inspector) can count the series and check they have data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

# Colour-blind-safe (Okabe-Ito), in the order the series come.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
WIDTH, PLOT_HEIGHT = 420, 172
LEFT, RIGHT, BOTTOM = 52, 14, 40


def line_chart(
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    xlabel: str = "epoch",
    dashed: Sequence[str] = (),
) -> str:
    """An SVG line chart of ``series`` (name -> ``(x, y)`` points); non-finite points dropped.

    Args:
        title: Shown above the plot.
        series: The lines, drawn in order, with a legend entry each.
        xlabel: The x axis' name; "epoch" puts the ticks on whole epochs. Defaults to "epoch".
        dashed: Names of the series drawn dashed (validation curves). Defaults to ().

    Returns:
        The ``<svg>`` element as text; a chart with a "no data" note when no point is finite.
    """
    clean = {
        name: [(float(x), float(y)) for x, y in pts if math.isfinite(x) and math.isfinite(y)]
        for name, pts in series.items()
    }
    clean = {k: v for k, v in clean.items() if v}
    legend, top = _legend(list(clean), set(dashed))
    height = top + PLOT_HEIGHT + BOTTOM
    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}"'
        f' viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" class="title">{escape(title)}</text>',
        *legend,
    ]
    if not clean:
        out.append(f'<text x="{WIDTH / 2}" y="{height / 2}" text-anchor="middle">no data</text>')
        return "\n".join([*out, "</svg>"])
    xs = [x for pts in clean.values() for x, _ in pts]
    ys = [y for pts in clean.values() for _, y in pts]
    x0, x1 = _span(min(xs), max(xs))
    y0, y1 = _span(min(ys), max(ys))
    w, h = WIDTH - LEFT - RIGHT, PLOT_HEIGHT

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * w

    def py(y: float) -> float:
        return top + h - (y - y0) / (y1 - y0) * h

    out.append(f'<rect x="{LEFT}" y="{top}" width="{w}" height="{h}" class="frame"/>')
    for yv in (y0 + f * (y1 - y0) for f in (0.05, 0.5, 0.95)):  # near the data's ends, and middle
        out.append(
            f'<text x="{LEFT - 4}" y="{py(yv) + 4:.1f}" text-anchor="end" class="tick">'
            f"{_fmt(yv)}</text>"
        )
    for xv in _xticks(min(xs), max(xs), integers=xlabel == "epoch"):
        out.append(
            f'<text x="{px(xv):.1f}" y="{top + h + 14}" text-anchor="middle" class="tick">'
            f"{_fmt(xv)}</text>"
        )
    out.append(
        f'<text x="{LEFT + w / 2}" y="{height - 6}" text-anchor="middle" class="axis">'
        f"{escape(xlabel)}</text>"
    )
    for i, (name, pts) in enumerate(clean.items()):
        colour = COLOURS[i % len(COLOURS)]
        d = " ".join(
            f"{'M' if j == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for j, (x, y) in enumerate(pts)
        )
        dash = ' stroke-dasharray="5,3"' if name in dashed else ""
        out.append(
            f'<path class="series" data-series="{escape(name)}" data-points="{len(pts)}" d="{d}"'
            f' fill="none" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        for x, y in pts if len(pts) <= 60 else ():  # markers, so one epoch still shows
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}"/>')
    return "\n".join([*out, "</svg>"])


def bar_chart(title: str, bars: Sequence[tuple[str, float | None]], ylabel: str = "") -> str:
    """An SVG bar chart from zero: one ``<rect class="bar" data-bar="NAME">`` per finite value,
    each in its own colour, with its value above it; a missing value shows "n/a".

    Args:
        title: Shown above the plot.
        bars: ``(name, value)`` in the order drawn, left to right.
        ylabel: The y axis' name. Defaults to "".

    Returns:
        The ``<svg>`` element as text; a chart with a "no data" note when no value is finite.
    """
    top, height = 28, 28 + PLOT_HEIGHT + BOTTOM
    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}"'
        f' viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" class="title">{escape(title)}</text>',
    ]
    values = [v for _, v in bars if v is not None and math.isfinite(v)]
    if not values:
        out.append(f'<text x="{WIDTH / 2}" y="{height / 2}" text-anchor="middle">no data</text>')
        return "\n".join([*out, "</svg>"])
    w, h = WIDTH - LEFT - RIGHT, PLOT_HEIGHT
    hi = max(max(values), 0.0) * 1.12 or 1.0
    out.append(f'<rect x="{LEFT}" y="{top}" width="{w}" height="{h}" class="frame"/>')
    for yv in (0.0, hi / 2, hi):
        out.append(
            f'<text x="{LEFT - 4}" y="{top + h - yv / hi * h + 4:.1f}" text-anchor="end"'
            f' class="tick">{_fmt(yv)}</text>'
        )
    slot = w / len(bars)
    for i, (name, value) in enumerate(bars):
        x = LEFT + i * slot + slot * 0.2
        mid = x + slot * 0.3
        out.append(
            f'<text x="{mid:.1f}" y="{top + h + 14}" text-anchor="middle" class="tick">'
            f"{escape(name)}</text>"
        )
        if value is None or not math.isfinite(value):
            out.append(f'<text x="{mid:.1f}" y="{top + h - 6}" text-anchor="middle">n/a</text>')
            continue
        bar = max(value, 0.0) / hi * h
        out.append(
            f'<rect class="bar" data-bar="{escape(name)}" data-value="{value:.6g}" x="{x:.1f}"'
            f' y="{top + h - bar:.1f}" width="{slot * 0.6:.1f}" height="{bar:.1f}"'
            f' fill="{COLOURS[i % len(COLOURS)]}"/>'
            f'<text x="{mid:.1f}" y="{top + h - bar - 4:.1f}" text-anchor="middle" class="tick">'
            f"{_fmt(value)}</text>"
        )
    out.append(
        f'<text x="{LEFT + w / 2}" y="{height - 6}" text-anchor="middle" class="axis">'
        f"{escape(ylabel)}</text>"
    )
    return "\n".join([*out, "</svg>"])


def page(title: str, parts: list[str]) -> str:
    """The whole HTML document: ``parts`` in order, the stylesheet inline."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}'
        f"</title><style>{_CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n"
    )


def section(title: str, body: str, anchor: str) -> str:
    """A titled ``<section id=anchor>``; "nothing logged" when ``body`` is empty."""
    body = body or '<p class="none">nothing logged</p>'
    return (
        f'<section id="{anchor}"><h2>{escape(title)}</h2><div class="charts">{body}</div></section>'
    )


def table(rows, head=None) -> str:
    """An escaped table of ``rows`` (tuples), with a ``head`` row when given; "" for none."""
    if not rows:
        return ""
    cells = "".join(
        "<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    top = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>" if head else ""
    return f"<table>{top}{cells}</table>"


def _legend(names: list[str], dashed: set[str]) -> tuple[list[str], int]:
    """The legend under the title, its entries wrapped into rows; and where the plot starts."""
    out, x, y = [], LEFT, 34
    for i, name in enumerate(names):
        width = 30 + 6.5 * len(name)
        if x > LEFT and x + width > WIDTH - RIGHT:
            x, y = LEFT, y + 15
        colour = COLOURS[i % len(COLOURS)]
        dash = ' stroke-dasharray="5,3"' if name in dashed else ""
        out.append(
            f'<line x1="{x}" y1="{y - 4}" x2="{x + 18}" y2="{y - 4}" stroke="{colour}"'
            f' stroke-width="2"{dash}/><text x="{x + 22}" y="{y}" class="legend">'
            f"{escape(name)}</text>"
        )
        x += width
    return out, y + 10


def _xticks(lo: float, hi: float, integers: bool) -> list[float]:
    """Epochs: whole numbers, at most 8 of them; anything else: the ends and the middle."""
    if not integers:
        return [lo, (lo + hi) / 2, hi] if hi > lo else [lo]
    first, last = math.ceil(lo), math.floor(hi)
    stride = max(1, math.ceil((last - first + 1) / 8))
    return [float(v) for v in range(first, last + 1, stride)]


def _span(lo: float, hi: float) -> tuple[float, float]:
    """The axis range: the data's, padded, and never empty (one point, or a flat line)."""
    if hi - lo < 1e-12 * max(1.0, abs(hi)):
        pad = abs(hi) * 0.05 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def _fmt(v: float) -> str:
    """Three significant digits, with k, M, G for thousands (bytes, samples/s): it fits."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1320px}
h1{font-size:22px}h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
.charts{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
table{border-collapse:collapse;margin:4px 12px 4px 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top;font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
svg.chart{border:1px solid #eee;background:#fff}.frame{fill:none;stroke:#bbb}
.title{font-weight:600;font-size:13px}.tick,.legend,.axis{font-size:11px;fill:#444}
.verdict{font-weight:700;padding:4px 10px;border-radius:4px;display:inline-block}
.figures td,.figures th{word-break:normal}
.passed{background:#d9f2e3}.refused{background:#fde2e1}.none{color:#777}
"""
