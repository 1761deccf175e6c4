"""A line chart as a small hand-written SVG: the benchmarks' plots without matplotlib.

Only what the benchmark figures need: a few series over the same x values,
x on a log scale (subscriber counts 1, 4, 16, 64), y linear from 0, axis
labels, grid lines and a legend. The output is plain SVG 1.1 text that a
browser or GitHub renders as is, with the numbers written next to the
points so the picture can be read without the table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["Series", "line_chart"]

WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 72, 210, 48, 64  # margins: the legend sits on the right
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"


@dataclass(frozen=True)
class Series:
    """One line: ``points`` as (x, y) pairs; ``dashed`` for a reference (a floor)."""

    label: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False


def _nice_step(span: float, ticks: int = 5) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving about ``ticks`` intervals."""
    raw = span / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if factor * power >= raw:
            return factor * power
    return 10 * power


def _label(value: float) -> str:
    return f"{value:g}" if value >= 10 or value == int(value) else f"{value:.1f}"


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    subtitle: str = "",
) -> str:
    """The SVG text of ``series`` over a log-scale x axis (x > 0) and a linear y axis from 0."""
    xs = sorted({x for s in series for x, _ in s.points})
    ys = [y for s in series for _, y in s.points]
    if not xs or any(x <= 0 for x in xs):
        raise ValueError("a log-scale x axis needs positive x values")
    top_y = max(ys) if ys else 1.0
    step = _nice_step(top_y * 1.08 or 1.0)
    y_max = step * math.ceil(top_y * 1.08 / step) if top_y > 0 else step
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    lo, hi = math.log(xs[0]), math.log(xs[-1])
    pad = 0.06 * (hi - lo) if hi > lo else 1.0

    def px(x: float) -> float:
        return LEFT + (math.log(x) - lo + pad) / (hi - lo + 2 * pad) * plot_w

    def py(y: float) -> float:
        return TOP + plot_h - y / y_max * plot_h

    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
        f"viewBox='0 0 {WIDTH} {HEIGHT}' {FONT} font-size='12'>",
        f"<rect width='{WIDTH}' height='{HEIGHT}' fill='white'/>",
        f"<text x='{LEFT}' y='20' font-size='15' font-weight='bold'>{escape(title)}</text>",
    ]
    if subtitle:
        out.append(f"<text x='{LEFT}' y='37' fill='#555'>{escape(subtitle)}</text>")
    # grid and y ticks
    tick = 0.0
    while tick <= y_max + step / 2:
        y = py(tick)
        out.append(
            f"<line x1='{LEFT}' y1='{y:.1f}' x2='{LEFT + plot_w}' y2='{y:.1f}' stroke='#e5e5e5'/>"
        )
        out.append(f"<text x='{LEFT - 6}' y='{y + 4:.1f}' text-anchor='end'>{_label(tick)}</text>")
        tick += step
    for x in xs:
        cx = px(x)
        out.append(
            f"<line x1='{cx:.1f}' y1='{TOP}' x2='{cx:.1f}' y2='{TOP + plot_h}' stroke='#f0f0f0'/>"
        )
        out.append(
            f"<text x='{cx:.1f}' y='{TOP + plot_h + 18}' text-anchor='middle'>{_label(x)}</text>"
        )
    # axes and their labels
    out.append(
        f"<polyline points='{LEFT},{TOP} {LEFT},{TOP + plot_h} {LEFT + plot_w},{TOP + plot_h}' "
        "fill='none' stroke='#333'/>"
    )
    out.append(
        f"<text x='{LEFT + plot_w / 2:.1f}' y='{HEIGHT - 18}' text-anchor='middle'>"
        f"{escape(x_label)}</text>"
    )
    mid = TOP + plot_h / 2
    out.append(
        f"<text x='18' y='{mid:.1f}' text-anchor='middle' transform='rotate(-90 18 {mid:.1f})'>"
        f"{escape(y_label)}</text>"
    )
    # the lines, their points and values, and the legend
    for index, s in enumerate(series):
        colour = COLOURS[index % len(COLOURS)]
        dash = " stroke-dasharray='6 4'" if s.dashed else ""
        points = sorted(s.points)
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        out.append(
            f"<polyline points='{path}' fill='none' stroke='{colour}' stroke-width='2'{dash}/>"
        )
        for x, y in points:
            out.append(f"<circle cx='{px(x):.1f}' cy='{py(y):.1f}' r='3.5' fill='{colour}'/>")
            out.append(
                f"<text x='{px(x) + 6:.1f}' y='{py(y) - 6:.1f}' fill='{colour}' "
                f"font-size='10'>{y:.2f}</text>"
            )
        ly = TOP + 10 + index * 22
        lx = LEFT + plot_w + 40
        out.append(
            f"<line x1='{lx}' y1='{ly}' x2='{lx + 24}' y2='{ly}' stroke='{colour}' "
            f"stroke-width='2'{dash}/>"
        )
        out.append(f"<text x='{lx + 30}' y='{ly + 4}'>{escape(s.label)}</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
