"""Charts as inline SVG, drawn on the server: no script, no library, no network.

Every function returns SVG markup whose every text is escaped here. The drawings scale
with the page (``viewBox``, width 100 %); colours come from the stylesheet's classes
(``.s-SUCCEEDED`` …) where a state is drawn, so the legend and the bars agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

__all__ = ["Series", "Span", "line_chart", "stacked_bars", "timeline"]

_W = 720
_H = 200
_LEFT = 48
_RIGHT = 12
_TOP = 12
_BOTTOM = 26


def _nice_max(value: float) -> float:
    """The top of the y axis: ``value`` rounded up to 1, 2 or 5 times a power of ten."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)


def _number(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _frame(
    inner: list[str],
    *,
    top: float,
    unit: str,
    times: Sequence[datetime],
    label: str,
    width: int,
    bottom: float = 0.0,
) -> str:
    plot_w = width - _LEFT - _RIGHT
    plot_h = _H - _TOP - _BOTTOM
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {_H}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i in range(5):  # grid lines and y labels
        y = _TOP + plot_h - plot_h * i / 4
        value = bottom + (top - bottom) * i / 4
        css = "grid zero" if value == 0 and bottom < 0 else "grid"
        parts.append(
            f'<line class="{css}" x1="{_LEFT}" x2="{width - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        parts.append(
            f'<text class="axis" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(_number(value))}{escape(unit)}</text>"
        )
    if times:
        n = len(times)
        for i in sorted({0, n // 4, n // 2, 3 * n // 4, n - 1}):
            x = _LEFT + plot_w * (i + 0.5) / n
            parts.append(
                f'<text class="axis" x="{x:.1f}" y="{_H - 8}" text-anchor="middle">'
                f"{escape(times[i].astimezone(UTC).strftime('%H:%M'))}</text>"
            )
    parts.extend(inner)
    parts.append("</svg>")
    return "".join(parts)


def stacked_bars(
    times: Sequence[datetime],
    stacks: Sequence[tuple[str, Sequence[int]]],
    *,
    label: str,
    width: int = _W,
) -> str:
    """One bar per time, its segments stacked in the order of ``stacks`` (name, counts);
    each segment has the class ``s-<name>`` and a tooltip."""
    n = len(times)
    totals = [sum(counts[i] for _, counts in stacks) for i in range(n)]
    top = _nice_max(max(totals, default=0))
    plot_w = width - _LEFT - _RIGHT
    plot_h = _H - _TOP - _BOTTOM
    bar = plot_w / max(n, 1)
    bars: list[str] = []
    for i in range(n):
        base = 0
        x = _LEFT + bar * i + bar * 0.1
        for name, counts in stacks:
            count = counts[i]
            if count <= 0:
                continue
            h = plot_h * count / top
            y = _TOP + plot_h - plot_h * base / top - h
            tip = f"{times[i].astimezone(UTC):%H:%M} UTC · {name}: {count}"
            bars.append(
                f'<rect class="s-{escape(name)}" x="{x:.1f}" y="{y:.1f}" '
                f'width="{bar * 0.8:.1f}" height="{h:.1f}"><title>{escape(tip)}</title></rect>'
            )
            base += count
    return _frame(bars, top=top, unit="", times=times, label=label, width=width)


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    css: str  # the line's class
    values: Sequence[float | None]  # one per time; None: no point


def line_chart(
    times: Sequence[datetime],
    series: Sequence[Series],
    *,
    unit: str,
    label: str,
    top: float = 0,
    width: int = _W,
) -> str:
    """A line per series (broken where a value is None), a dot on each point. Values
    below zero (a run dispatched ahead of its fire time) get room below the zero line."""
    n = len(times)
    found = [v for s in series for v in s.values if v is not None]
    high, low = max(found, default=0.0), min(found, default=0.0)
    bottom = 0.0
    if not top and low < 0:
        # Of the four grid steps, 1 to 3 lie below zero: whichever gives the smallest.
        step, below = min((_nice_max(max(high / (4 - b), -low / b)), b) for b in (1, 2, 3))
        top, bottom = step * (4 - below), -step * below
    top = top or _nice_max(high)
    span = top - bottom
    plot_w = width - _LEFT - _RIGHT
    plot_h = _H - _TOP - _BOTTOM
    inner: list[str] = []
    for s in series:
        runs: list[list[tuple[float, float]]] = [[]]
        for i, v in enumerate(s.values):
            if v is None:
                runs.append([])
                continue
            x = _LEFT + plot_w * (i + 0.5) / max(n, 1)
            y = _TOP + plot_h - plot_h * (min(max(v, bottom), top) - bottom) / span
            runs[-1].append((x, y))
            tip = f"{times[i].astimezone(UTC):%H:%M} UTC · {s.name}: {v:.4g}{unit}"
            inner.append(
                f'<circle class="dot {escape(s.css)}" cx="{x:.1f}" cy="{y:.1f}" r="2.2">'
                f"<title>{escape(tip)}</title></circle>"
            )
        for points in runs:
            if len(points) > 1:
                path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
                inner.insert(0, f'<polyline class="line {escape(s.css)}" points="{path}"/>')
    return _frame(inner, top=top, unit=unit, times=times, label=label, width=width, bottom=bottom)


@dataclass(frozen=True, slots=True)
class Span:
    """One bar of a timeline: an attempt, or the wait before the first."""

    label: str
    start: datetime
    end: datetime
    css: str  # its class (an attempt's state: ``a-SUCCEEDED`` …)
    tip: str


def timeline(
    spans: Sequence[Span],
    marks: Sequence[tuple[str, datetime]],
    *,
    label: str,
    width: int = 1100,
) -> str:
    """Spans on rows under a shared time axis, with vertical marks (due, finished …)."""
    if not spans and not marks:
        return ""
    instants = [s.start for s in spans] + [s.end for s in spans] + [m[1] for m in marks]
    first, last = min(instants), max(instants)
    total = max((last - first).total_seconds(), 0.001)
    left, right, row_h = 110, 16, 26
    height = 34 + row_h * max(len(spans), 1)
    plot_w = width - left - right

    def x_of(at: datetime) -> float:
        return left + plot_w * (at - first).total_seconds() / total

    parts = [
        f'<svg class="chart timeline" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, span in enumerate(spans):
        y = 8 + row_h * i
        x0, x1 = x_of(span.start), x_of(span.end)
        parts.append(
            f'<text class="axis" x="{left - 8}" y="{y + 15}" text-anchor="end">'
            f"{escape(span.label)}</text>"
        )
        parts.append(
            f'<rect class="{escape(span.css)}" x="{x0:.1f}" y="{y + 3}" '
            f'width="{max(x1 - x0, 2):.1f}" height="{row_h - 8}" rx="3">'
            f"<title>{escape(span.tip)}</title></rect>"
        )
    axis_y = height - 8
    for name, at in marks:
        x = x_of(at)
        parts.append(
            f'<line class="mark" x1="{x:.1f}" x2="{x:.1f}" y1="4" y2="{axis_y - 12}">'
            f"<title>{escape(name)}: {escape(at.astimezone(UTC).isoformat())}</title></line>"
        )
    parts.append(
        f'<text class="axis" x="{left}" y="{axis_y}">'
        f"{escape(first.astimezone(UTC).strftime('%H:%M:%S'))}</text>"
    )
    parts.append(
        f'<text class="axis" x="{width - right}" y="{axis_y}" text-anchor="end">'
        f"{escape(last.astimezone(UTC).strftime('%H:%M:%S'))} UTC "
        f"(+{escape(_span_text(total))})</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def _span_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"
