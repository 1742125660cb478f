"""Cost of ``cronwheel.timing.next_after`` for typical schedules, and (with
``--materialise-jobs N``) the time to fire N cron jobs due at one instant, each firing
materialising its job's next run (``materialise.py``).

Each case walks a chain of due instants the way the scheduler does (every call starts
from the previous due instant) for at most ``--calls`` steps or ``--span-days``; the
chain is walked once to warm the per-zone caches, then ``--calls`` calls per round
cycle through it, each timed on its own. Prints a JSON document on stdout, then a
table on stderr.

    python bench/timing.py --calls 2000 --rounds 5 --span-days 1500
    python bench/timing.py --materialise-jobs 100000 --backend postgresql
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from cronwheel.domain.spec import CronSchedule, IntervalSchedule
from cronwheel.timing import compile_schedule, next_after

CASES: list[tuple[str, CronSchedule | IntervalSchedule]] = [
    ("every 5 min, UTC", CronSchedule(cron="*/5 * * * *")),
    ("hourly, Europe/Berlin", CronSchedule(cron="@hourly", timezone="Europe/Berlin")),
    (
        "01:30 daily, New York, all",
        CronSchedule(cron="30 1 * * *", timezone="America/New_York", on_ambiguous="all"),
    ),
    ("02:30 daily, New York, shift", CronSchedule(cron="30 2 * * *", timezone="America/New_York")),
    ("9:00 weekdays, Kolkata", CronSchedule(cron="0 9 * * mon-fri", timezone="Asia/Kolkata")),
    ("every 15 s, Lord Howe", CronSchedule(cron="*/15 * * * * *", timezone="Australia/Lord_Howe")),
    (
        "1st and 15th or Monday, Chatham",
        CronSchedule(cron="0 12 1,15 * mon", timezone="Pacific/Chatham"),
    ),
    ("29 February, UTC", CronSchedule(cron="0 0 29 2 *")),
    ("interval 300 s", IntervalSchedule(interval=300)),
]


def _chain(
    spec: CronSchedule | IntervalSchedule, start: datetime, calls: int, stop: datetime
) -> list[datetime]:
    out = [start]
    for _ in range(calls - 1):
        nxt = next_after(spec, out[-1])
        if nxt is None or nxt > stop:
            break
        out.append(nxt)
    return out


def _measure(
    spec: CronSchedule | IntervalSchedule, chain: list[datetime], calls: int, rounds: int
) -> list[float]:
    samples: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for i in range(calls):
            instant = chain[i % len(chain)]
            t0 = clock()
            next_after(spec, instant)
            samples.append((clock() - t0) / 1000.0)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per chain (per round)")
    parser.add_argument("--rounds", type=int, default=5, help="measured passes over each chain")
    parser.add_argument("--span-days", type=int, default=1500, help="longest chain, in days")
    parser.add_argument("--start", default="2026-01-01T00:00:00+00:00", help="first instant")
    parser.add_argument(
        "--materialise-jobs",
        type=int,
        default=0,
        help="also time firing this many cron jobs due at one instant (0: skip)",
    )
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="postgresql")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.rounds < 1 or args.span_days < 1:
        parser.error("--calls, --rounds and --span-days must be at least 1")
    if args.materialise_jobs < 0:
        parser.error("--materialise-jobs cannot be negative")
    start = datetime.fromisoformat(args.start).astimezone(UTC)
    stop = start + timedelta(days=args.span_days)

    results: list[dict[str, Any]] = []
    for name, spec in CASES:
        compile_schedule(spec)
        cold_t0 = time.perf_counter()
        chain = _chain(spec, start, args.calls, stop)  # also warms the zone tables
        cold_total = time.perf_counter() - cold_t0
        samples = _measure(spec, chain, args.calls, args.rounds)
        samples.sort()
        results.append(
            {
                "case": name,
                "calls": len(samples),
                "median_us": round(statistics.median(samples), 2),
                "p99_us": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 2),
                "max_us": round(samples[-1], 2),
                "chain_length": len(chain),
                "chain_end": chain[-1].isoformat(),
                "cold_chain_s": round(cold_total, 4),
            }
        )
    doc = {
        "benchmark": "timing.next_after",
        "python": platform.python_version(),
        "calls_per_round": args.calls,
        "rounds": args.rounds,
        "span_days": args.span_days,
        "results": results,
    }
    if args.materialise_jobs:
        import materialise  # the sibling benchmark; bench/ is on sys.path when run

        doc["materialise"] = asyncio.run(materialise.measure(args.materialise_jobs, args.backend))
    print(json.dumps(doc, indent=2))
    width = max(len(r["case"]) for r in results)
    print(f"\n{'case':<{width}}  {'median µs':>10}  {'p99 µs':>8}  {'max µs':>8}", file=sys.stderr)
    for r in results:
        print(
            f"{r['case']:<{width}}  {r['median_us']:>10.2f}  {r['p99_us']:>8.2f}  "
            f"{r['max_us']:>8.2f}",
            file=sys.stderr,
        )
    if args.materialise_jobs:
        m = doc["materialise"]
        print(
            f"\nmaterialise {m['jobs']} cron jobs ({m['backend']}): {m['seconds']:.2f} s, "
            f"{m['runs_per_s']} runs/s, {m['next_runs_created']} next runs created",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
