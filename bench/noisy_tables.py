"""The tables ``noisy_neighbour.py`` prints on stderr, one per scenario, from the results
it prints as JSON."""

from __future__ import annotations

from typing import Any

P99_TARGET_MS = 500.0  # B's start lateness at each instant
SHARE_TOLERANCE = 0.05  # ± 5 points of the share each weight gives
Table = tuple[str, list[tuple[str, ...]], tuple[str, ...]]


def verdict(value: float | None, target: float) -> str:
    return f"≤ {target:g}: {'met' if value is not None and value <= target else 'MISSED'}"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def p0_table(r: dict[str, Any]) -> Table:
    rows: list[tuple[str, ...]] = []
    for label, b in r["b"].items():
        d = b["dispatch_lateness_ms"]
        rows.append(
            (f"B at {label}, dispatch lateness ms", ms(d["p50"]), ms(d["p99"]), ms(d["max"]))
        )
        if b["not_started"]:
            rows.append((f"B at {label}, runs not started when it stopped", str(b["not_started"])))
        for how in ("handler", "started_at"):
            p = b[f"start_lateness_{how}_ms"]
            cells = (ms(p["p50"]), ms(p["p99"]), ms(p["max"]), verdict(p["p99"], P99_TARGET_MS))
            rows.append((f"B at {label}, start lateness ({how}) ms", *cells))
    share = f"{100 * r['a_rate_of_capacity']:.0f} % of {r['pool_capacity_per_s']:,.0f}/s"
    share += f" ({r['pool_slots']} slots)"
    rows += [
        ("A completed per s (T → A's last)", f"{r['a_completion_per_s']:,.0f}", "", "", share),
        ("A finished", f"{r['a_finished']:,}"),
        (
            "A dispatched from / to (s after T)",
            " / ".join(f"{x:.1f}" for x in r["a_dispatched_s_after_t"]),
        ),
        ("T → A's last run finished (s)", f"{r['a_last_finished_s_after_t']:,.1f}"),
        ("T → last run finished (s)", f"{r['total_s_t_to_last_finished']:,.1f}"),
        *common_rows(r, 4),
    ]
    title = (
        f"p0: A {r['a_runs']:,} P2 runs at T; B {r['b_runs_per_instant']} P0 runs at each instant"
    )
    return title, rows, ("measure", "p50 / value", "p99", "max", "target")


def common_rows(r: dict[str, Any], target: int) -> list[tuple[str, ...]]:
    """Runs lost and run twice (the target in column ``target``), then the machine."""
    m, twice = r["machine"], r["runs_run_twice"]
    pad = ("",) * (target - 2)
    loads = [
        " ".join(f"{x:.2f}" for x in m[k]) for k in ("load_average_before", "load_average_after")
    ]
    return [
        (
            "runs lost / not finished when it stopped",
            f"{r['runs_lost']} / {r['runs_unfinished']}",
            *pad,
            "0 / -",
        ),
        (
            "runs run twice (database / handler)",
            f"{twice['database']} / {twice['handler']}",
            *pad,
            "0",
        ),
        ("load average before (1 / 5 / 15 min)", loads[0]),
        ("load average after", loads[1]),
        (f"machine CPU % from T (of {100 * m['cores']})", f"{m['cpu_percent_since_t']:.0f}"),
    ]


def weights_table(r: dict[str, Any]) -> Table:
    (w1, w2), (t1, t2) = r["weights"], r["target_shares"]
    rows: list[tuple[str, ...]] = []
    for how in ("started_at", "handler"):
        for win in r[f"windows_{how}"]:
            (c1, c2), (s1, s2) = win["started"], win["shares"]
            rows.append(
                (f"T+{win['from_s']}-{win['to_s']} s ({how})", f"{c1:,} / {c2:,}",
                 f"{100 * s1:.1f} % / {100 * s2:.1f} %", "within" if win["within"] else "OUTSIDE")
            )  # fmt: skip
    if not r["windows_started_at"]:
        rows.append(("no whole window after the first", "", "raise --weights-runs"))
    rows += [
        ("both tenants waiting until (s after T)", f"{r['both_waiting_until_s_after_t']:.1f}"),
        *common_rows(r, 3),
    ]
    title = (
        f"weights {w1} and {w2}: {r['runs_per_tenant']:,} runs each at T; "
        f"target {100 * t1:.0f} % / {100 * t2:.0f} % ± {100 * r['tolerance']:.0f} points"
    )
    return title, rows, ("window", f"runs started ({w1} / {w2})", "shares", "±5 points")


def cap_table(r: dict[str, Any]) -> Table:
    c, d = r["throughput"]["C"], r["throughput"]["D"]
    held = ", ".join(f"{k}: {v}" for k, v in r["held_histogram"].items())
    seen, over = r["max_held"], f"{r['samples']} / {r['samples_over_cap']}"
    rows: list[tuple[str, ...]] = [
        ("C's runs leased or running, max seen", str(seen), verdict(seen, r["cap"])),
        (f"samples (every {r['poll_ms']:g} ms) / over the cap", over),
        ("samples by count held", held if len(held) < 60 else held[:57] + "…"),
        ("D finished per s (T → its last)", ms(d["per_s"]), f"in {d['last_s_after_t']:.1f} s"),
        ("C finished per s (T → its last)", ms(c["per_s"]), f"in {c['last_s_after_t']:.1f} s"),
        ("pool capacity per s", f"{r['pool_capacity_per_s']:,.0f}"),
        *common_rows(r, 2),
    ]  # fmt: skip
    title = (
        f"cap: C max_concurrent_runs = {r['cap']}, C and D {r['runs_per_tenant']:,} runs each at T"
    )
    return title, rows, ("measure", "value", "target")
