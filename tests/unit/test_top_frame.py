"""``cronwheel top``'s frame, from an overview body: the sparkline's bars and
grouping, and what the summary shows as "now"."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

from rich.console import Console

from cronwheel.cli.top import render, sparkline


def test_sparkline_heights_and_groups() -> None:
    assert sparkline([]) == ""
    assert sparkline([0, 0, 0]) == "   "
    assert sparkline([0, 1, 4, 8]) == " ▁▄█"
    assert sparkline([5]) == "█"
    # 1440 minutes in 60 columns of 24 minutes each, summed.
    long = [0] * 1440
    long[-1] = 3
    assert sparkline(long) == " " * 59 + "█"
    assert len(sparkline([1] * 90)) == 45  # groups of two


def _minute(at: str, states: dict[str, int], dispatch: float | None) -> dict[str, Any]:
    return {
        "at": at,
        "states": states,
        "dispatch_lateness_p50_ms": dispatch,
        "dispatch_lateness_p99_ms": dispatch,
        "start_lateness_p50_ms": None,
        "start_lateness_p99_ms": None,
    }


def test_now_is_the_newest_minute_measured() -> None:
    body = {
        "minutes": [
            _minute("2031-01-01T00:00:00Z", {"SUCCESS": 3, "FAILED": 1}, 12.5),
            _minute("2031-01-01T00:01:00Z", {"SCHEDULED": 2}, None),
        ],
        "total": {
            **_minute("2031-01-01T00:00:00Z", {"SUCCESS": 3, "FAILED": 1, "SCHEDULED": 2}, 20.0),
            "runs": 6,
            "success_rate": 0.75,
        },
        "alerts": [],
        "pools": [],
    }
    out = io.StringIO()
    Console(file=out, width=200).print(
        render(body, source="here", now=datetime(2031, 1, 1, 0, 1, 30, tzinfo=UTC))
    )
    text = out.getvalue()
    assert "cronwheel top — here — 00:01:30 UTC" in text
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if "│" in line}
    # window, then now: the minute of 00:00, the newest with a lateness.
    assert [c.strip() for c in lines["runs due"].split("│")[2:4]] == ["6", "4"]
    assert [c.strip() for c in lines["success rate"].split("│")[2:4]] == ["75.0 %", "75.0 %"]
    dispatch = [c.strip() for c in lines["dispatch lateness p50 / p99"].split("│")[2:4]]
    assert dispatch == ["20.0 ms / 20.0 ms", "12.5 ms / 12.5 ms"]
    assert "now: the runs due in the minute of 00:00 UTC" in text
    assert [c.strip() for c in lines["SCHEDULED"].split("│")[2:4]] == ["2", "2"]
    assert "no active alerts" in text


def test_a_failed_read_keeps_the_last_figures_with_their_age() -> None:
    out = io.StringIO()
    read_at = datetime(2031, 1, 1, 0, 0, 0, tzinfo=UTC)
    body = {
        "minutes": [],
        "total": {**_minute("x", {}, None), "runs": 0, "success_rate": None},
        "alerts": [],
        "pools": [],
    }
    frame = render(
        body,
        source="here",
        error="boom [server_error]",
        read_at=read_at,
        now=datetime(2031, 1, 1, 0, 0, 42, tzinfo=UTC),
    )
    Console(file=out, width=200).print(frame)
    assert "error: boom [server_error]" in out.getvalue()
    assert "showing the overview read 42 s ago" in out.getvalue()
    assert "runs due" in out.getvalue()
