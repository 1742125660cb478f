"""``cronwheel top``: the overview (``GET /v1/overview``) as a live terminal view.

::

    read the overview ──▶ render a frame ──▶ show it (Rich Live) ──▶ wait --interval ─┐
          ▲                                                                          │
          └──────────────────────────────────────────────────────────────────────────┘

A failed read is shown in the frame, above the last figures read (marked with their
age), and the loop goes on; Ctrl-C ends it. ``--once`` prints one frame and exits: 0
when the read succeeded, 1 when it failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from cronwheel.cli.options import DEFAULT_URL, ApiKeyOpt, TenantOpt, UrlOpt, client_for
from cronwheel.cli.output import console, short_time, table
from cronwheel.client import ApiError, Client

__all__ = ["render", "sparkline", "top"]

_BARS = "▁▂▃▄▅▆▇█"
# The states shown as rows even when none of the window's runs is in them.
_ALWAYS = ("SUCCESS", "FAILED", "DEAD_LETTER")
_ORDER = (
    "SUCCESS",
    "FAILED",
    "DEAD_LETTER",
    "CANCELLED",
    "SKIPPED",
    "RUNNING",
    "DISPATCHED",
    "SCHEDULED",
)
_SPARK_WIDTH = 60  # at most this many columns: longer windows are summed in groups
_sleep = time.sleep  # between refreshes (a test replaces it)

_MinutesOpt = Annotated[
    int,
    typer.Option(
        "--minutes",
        min=1,
        max=1440,
        show_default=True,
        help="The window: this many minutes up to now, the current one included.",
    ),
]
_IntervalOpt = Annotated[
    float,
    typer.Option(
        "--interval", min=0.2, max=3600, show_default=True, help="Seconds between refreshes."
    ),
]
_OnceOpt = Annotated[bool, typer.Option("--once", help="Print one frame and exit.")]


def sparkline(values: Sequence[int], width: int = _SPARK_WIDTH) -> str:
    """One character per value (values summed in groups to fit ``width``): a bar of
    height relative to the largest, a space for zero (so one run still shows)."""
    if not values:
        return ""
    size = -(-len(values) // width)  # ceil
    groups = [sum(values[i : i + size]) for i in range(0, len(values), size)]
    top = max(groups)
    if top == 0:
        return " " * len(groups)
    return "".join(
        " " if v == 0 else _BARS[min(len(_BARS) - 1, (v * len(_BARS) - 1) // top)] for v in groups
    )


def _ms(value: Any) -> str:
    if value is None:
        return "-"
    ms = float(value)
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"


def _clock(value: Any) -> str:
    """An API instant as ``HH:MM``."""
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).strftime("%H:%M")
    except ValueError:
        return str(value)


def _rate(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.1f} %"


def _latest_measured(minutes: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest minute with a lateness measured: what "now" shows."""
    keys = ("dispatch_lateness_p50_ms", "start_lateness_p50_ms")
    measured = [m for m in minutes if any(m.get(k) is not None for k in keys)]
    return measured[-1] if measured else None


def _runs(body: dict[str, Any]) -> RenderableType:
    minutes: list[dict[str, Any]] = body.get("minutes") or []
    states: dict[str, int] = body["total"]["states"]
    shown = [s for s in _ORDER if s in _ALWAYS or states.get(s)]
    shown += sorted(s for s in states if s not in _ORDER and states[s])
    rows = []
    for state in shown:
        series = [int(m["states"].get(state, 0)) for m in minutes]
        last = series[-1] if series else 0
        rows.append((state, states.get(state, 0), last, sparkline(series)))
    return table(
        f"runs due per minute, by state now ({len(minutes)} min)",
        ["state", "window", "this minute", "per minute"],
        rows,
    )


def _minute_rate(states: dict[str, int]) -> float | None:
    """The success rate of one minute, as the server computes the window's."""
    outcomes = sum(states.get(s, 0) for s in _ALWAYS)
    return None if outcomes == 0 else states.get("SUCCESS", 0) / outcomes


def _summary(body: dict[str, Any]) -> RenderableType:
    total = body["total"]
    now = _latest_measured(body.get("minutes") or [])
    states: dict[str, int] = {} if now is None else now["states"]
    rows: list[tuple[str, ...]] = [
        ("runs due", str(total.get("runs", 0)), "-" if now is None else str(sum(states.values()))),
        ("success rate", _rate(total.get("success_rate")), _rate(_minute_rate(states))),
    ]
    for label, key in (
        ("dispatch lateness p50 / p99", "dispatch"),
        ("start lateness p50 / p99", "start"),
    ):
        p50, p99 = f"{key}_lateness_p50_ms", f"{key}_lateness_p99_ms"
        latest = "-" if now is None else f"{_ms(now.get(p50))} / {_ms(now.get(p99))}"
        rows.append((label, f"{_ms(total.get(p50))} / {_ms(total.get(p99))}", latest))
    caption = (
        "now: no run of the window measured yet"
        if now is None
        else f"now: the runs due in the minute of {_clock(now.get('at'))} UTC"
    )
    return table("summary", ["", "window", "now"], rows, caption=caption)


def _alerts(body: dict[str, Any]) -> RenderableType:
    alerts: list[dict[str, Any]] = body.get("alerts") or []
    if not alerts:
        return Text("no active alerts", style="green")
    rows = [
        (
            a.get("kind"),
            a.get("tenant_id"),
            a.get("pool"),
            a.get("runs"),
            short_time(a.get("since")),
            a.get("message"),
        )
        for a in alerts
    ]
    return table(
        f"alerts ({len(rows)})", ["kind", "tenant", "pool", "runs", "since", "message"], rows
    )


def _pools(body: dict[str, Any]) -> RenderableType:
    pools: list[dict[str, Any]] = body.get("pools") or []
    if not pools:
        return Text("no pool has a live worker or a backlog")
    rows = [
        (
            p.get("name"),
            p.get("workers"),
            p.get("capacity"),
            p.get("busy"),
            "-" if p.get("free") is None else p.get("free"),
            p.get("ready"),
            p.get("due"),
        )
        for p in pools
    ]
    return table(
        "pools",
        ["pool", "workers", "slots", "busy", "free", "ready (waiting)", "due (not dispatched)"],
        rows,
    )


def render(
    body: dict[str, Any] | None,
    *,
    source: str,
    error: str | None = None,
    read_at: datetime | None = None,
    now: datetime | None = None,
) -> RenderableType:
    """One frame: a heading, the error of the last read if it failed, then the last
    overview read (``body``; None: none yet) and its age when it is not fresh."""
    now = now or datetime.now(UTC)
    heading = Text(f"cronwheel top — {source} — {now.strftime('%H:%M:%S')} UTC", style="bold")
    parts: list[RenderableType] = [heading]
    if error is not None:
        parts.append(Text(f"error: {error}", style="bold red"))
        if body is not None and read_at is not None:
            age = (now - read_at).total_seconds()
            parts.append(Text(f"showing the overview read {age:.0f} s ago", style="yellow"))
    if body is not None:
        parts += [_summary(body), _runs(body), _alerts(body), _pools(body)]
    return Group(*parts)


def _describe(exc: ApiError) -> str:
    hint = " — is the server running? check --url" if exc.status == 0 else ""
    return f"{exc.message} [{exc.code}]{hint}"


class _Reader:
    """Reads the overview; keeps the last one read and the last failure."""

    def __init__(self, client: Client, minutes: int, source: str) -> None:
        self.client = client
        self.minutes = minutes
        self.source = source
        self.body: dict[str, Any] | None = None
        self.read_at: datetime | None = None
        self.error: str | None = None

    def read(self) -> RenderableType:
        try:
            self.body = self.client.overview(minutes=self.minutes)
        except ApiError as exc:
            self.error = _describe(exc)
        else:
            self.read_at, self.error = datetime.now(UTC), None
        return render(self.body, source=self.source, error=self.error, read_at=self.read_at)


def top(
    url: UrlOpt = DEFAULT_URL,
    api_key: ApiKeyOpt = None,
    tenant: TenantOpt = None,
    minutes: _MinutesOpt = 30,
    interval: _IntervalOpt = 2.0,
    once: _OnceOpt = False,
) -> None:
    """A live view of the overview, refreshed every --interval seconds: the runs due
    per minute by state, the success rate, dispatch and start lateness (p50 / p99 of
    the newest minute measured and of the window), the active alerts, and each pool's
    workers, free slots and waiting runs. Ctrl-C quits; --once prints one frame (exit
    1 if the read failed). A tenant key shows its tenant's; the admin key every
    tenant's (one tenant's with --tenant)."""
    source = url if tenant is None else f"{url} (tenant {tenant})"
    with client_for(url, api_key, tenant) as client:
        reader = _Reader(client, minutes, source)
        if once:
            console.print(reader.read())
            if reader.error is not None:
                raise typer.Exit(1)
            return
        _loop(reader.read, interval)


def _loop(frame: Callable[[], RenderableType], interval: float) -> None:
    try:
        with Live(frame(), console=console, auto_refresh=False, screen=False) as live:
            while True:
                _sleep(interval)
                live.update(frame(), refresh=True)
    except KeyboardInterrupt:
        pass
