"""The dashboard's server-drawn charts and schedule words: well-formed SVG, values
placed where they belong, every text escaped."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest

from cronwheel.ui.charts import Series, Span, line_chart, stacked_bars, timeline
from cronwheel.ui.render import duration, first_line, wall_time
from cronwheel.ui.words import cron_in_words, schedule_in_words

T0 = datetime(2999, 1, 1, 12, 0, tzinfo=UTC)
TIMES = [T0 + timedelta(minutes=i) for i in range(4)]
SVG = "{http://www.w3.org/2000/svg}"


def _parse(markup: str) -> ET.Element:
    return ET.fromstring(markup)


def test_stacked_bars_stack_each_minutes_states() -> None:
    svg = _parse(
        stacked_bars(
            TIMES, [("SUCCESS", [1, 0, 3, 0]), ("FAILED", [1, 0, 1, 0])], label="<x>", width=1100
        )
    )
    assert svg.get("viewBox") == "0 0 1100 200"
    rects = svg.findall(f"{SVG}rect")
    assert [r.get("class") for r in rects] == ["s-SUCCESS", "s-FAILED", "s-SUCCESS", "s-FAILED"]
    # The third minute's bar (4 runs) is twice as tall as the first's (2).
    heights = [float(r.get("height", 0)) for r in rects]
    assert heights[2] + heights[3] == pytest.approx(2 * (heights[0] + heights[1]), rel=0.01)
    assert svg.get("aria-label") == "<x>"  # escaped in the markup, whole when parsed


def test_a_line_below_zero_gets_room_under_the_zero_line() -> None:
    markup = line_chart(
        TIMES, [Series("dispatch", "l-d", [-40.0, None, 120.0, 80.0])], unit=" ms", label="l"
    )
    svg = _parse(markup)
    labels = [t.text for t in svg.findall(f"{SVG}text")]
    assert "0 ms" in labels and any(x and x.startswith("-") for x in labels)
    ys = [float(c.get("cy", 0)) for c in svg.findall(f"{SVG}circle")]
    zero = next(
        float(line.get("y1", 0))
        for line in svg.findall(f"{SVG}line")
        if "zero" in (line.get("class") or "")
    )
    assert ys[0] > zero > ys[1]  # -40 below the zero line, 120 above
    assert len(svg.findall(f"{SVG}polyline")) == 1  # broken at the gap: one two-point line


def test_the_timeline_draws_each_attempt_in_order() -> None:
    spans = [
        Span("attempt 1", T0, T0 + timedelta(seconds=2), "a-FAILED", "boom <b>"),
        Span("attempt 2", T0 + timedelta(seconds=3), T0 + timedelta(seconds=5), "a-SUCCEEDED", ""),
    ]
    svg = _parse(timeline(spans, [("due", T0)], label="t"))
    rects = svg.findall(f"{SVG}rect")
    assert [r.get("class") for r in rects] == ["a-FAILED", "a-SUCCEEDED"]
    assert float(rects[0].get("x", 0)) < float(rects[1].get("x", 0))
    assert rects[0].find(f"{SVG}title").text == "boom <b>"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("* * * * *", "every minute"),
        ("*/15 * * * *", "every 15 minutes"),
        ("30 9 * * mon-fri", "at 09:30 on Monday through Friday"),
        ("0 0 1 * *", "at 00:00 on day 1 of the month"),
        ("@hourly", "at minute 0 of every hour"),
        ("0 0 13 * fri", "at 00:00 on day 13 of the month or on Friday"),
        ("0 6 * jan,jul *", "at 06:00 in January and July"),
        ("5-10/2 * * * *", None),  # left to the expression itself
    ],
)
def test_cron_in_words(expression: str, words: str | None) -> None:
    assert cron_in_words(expression) == words


def test_schedules_in_words() -> None:
    assert schedule_in_words({"interval": 300}) == "every 5 minutes"
    assert schedule_in_words({"cron": "0 2 * * *", "timezone": "Europe/Paris"}) == (
        "at 02:00 every day (Europe/Paris)"
    )
    assert schedule_in_words({"asap": True}) == "once, as soon as possible"
    assert duration(0.25) == "250 ms" and duration(3725) == "1 h 2 min"
    assert first_line("Error: x\n  Traceback ...") == "Error: x"
    assert wall_time("2026-12-06T02:30:00+01:00") == "2026-12-06 02:30:00 +01:00"
    assert wall_time("2026-03-29T02:30:00 (skipped)") == "2026-03-29T02:30:00 (skipped)"
