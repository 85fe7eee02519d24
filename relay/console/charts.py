"""Charts as inline SVG, drawn on the server: no script and no library in the browser.

A chart is lines over time: x is the time window, y runs from zero to a round number above the
largest value. This module works out the numbers; templates/chart.html draws them. Colours come
from the stylesheet (each series has a class), so the markup carries only numbers and escaped
labels.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT = 480, 200
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 12, 26
# Time labels: the first of these steps (minutes) that puts at most MAX_TICKS on the axis.
TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 240)
MAX_TICKS = 6


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    css: str  # the stylesheet's class for its colour
    points: Sequence[tuple[dt.datetime, float]]
    total: str | None = None  # shown in the legend


def nice_top(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above `value` (1 for nothing)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)


def corners(
    points: Sequence[tuple[dt.datetime, float]],
) -> list[tuple[dt.datetime, float]]:
    """The points where the line bends: a run of equal values is drawn from its two ends, so
    three quiet hours are two points, not 180."""
    return [
        p
        for i, p in enumerate(points)
        if i in (0, len(points) - 1) or not points[i - 1][1] == p[1] == points[i + 1][1]
    ]


def _label(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


@dataclass(frozen=True, slots=True)
class Chart:
    """What templates/chart.html draws: every number worked out, every label plain text."""

    title: str
    series: Sequence[Series]
    grid: list[dict[str, object]]
    ticks: list[dict[str, object]]
    lines: list[dict[str, str]]
    empty: dict[str, object] | None
    width: int = WIDTH
    height: int = HEIGHT


def line_chart(
    title: str, series: Sequence[Series], start: dt.datetime, end: dt.datetime, empty: str
) -> Chart:
    """`series` over [start, end]; `empty` is said instead when no series has a point."""
    span = max((end - start).total_seconds(), 1.0)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = nice_top(max((v for s in series for _, v in s.points), default=0.0))

    def x(t: dt.datetime) -> float:
        return LEFT + plot_w * min(max((t - start).total_seconds() / span, 0.0), 1.0)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    grid: list[dict[str, object]] = [
        {"x1": LEFT, "x2": WIDTH - RIGHT, "y": f"{y(v):.1f}", "lx": LEFT - 6,
         "ty": f"{y(v) + 4:.1f}", "label": _label(v)}
        for v in (0.0, top / 2, top)
    ]  # fmt: skip
    ticks: list[dict[str, object]] = []
    step = next((m for m in TICK_STEPS if span / (60 * m) <= MAX_TICKS), TICK_STEPS[-1])
    day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    tick = day + dt.timedelta(minutes=((start - day).total_seconds() // (60 * step) + 1) * step)
    while tick < end:
        ticks.append({"x": f"{x(tick):.1f}", "y": HEIGHT - 8, "label": tick.strftime("%H:%M")})
        tick += dt.timedelta(minutes=step)
    lines = [
        {"css": s.css, "name": s.name,
         "points": " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in corners(s.points))}
        for s in series
        if s.points
    ]  # fmt: skip
    blank = None if lines else {"x": LEFT + plot_w / 2, "y": TOP + plot_h / 2, "text": empty}
    return Chart(title, series, grid, ticks, lines, blank)
