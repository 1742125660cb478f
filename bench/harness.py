"""Shared machinery of the benchmarks: start real cronwheel processes on a fresh
database, create tenants, keys and runs through the API, collect run histories, sample
processes, and print JSON plus a table. Benchmarks run the product as users do: the CLI
and the HTTP API."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cronwheel.domain.model import Event, Run
from cronwheel.domain.sharding import NUM_SHARDS
from cronwheel.settings import normalise_database_url
from cronwheel.store import RunFilter, Store, create_store
from cronwheel.testing import Cluster

__all__ = [
    "HERE",
    "PG_ADMIN",
    "Cluster",
    "History",
    "ProcSample",
    "Setup",
    "add_ahead_arguments",
    "ahead_env",
    "bench_cluster",
    "collect",
    "console",
    "create_ahead",
    "create_runs",
    "fresh_database",
    "handler_lateness_ms",
    "handler_starts",
    "histogram",
    "lateness_ms",
    "machine_busy",
    "open_store",
    "percentiles",
    "print_table",
    "proc_sample",
    "profile",
    "progress_bar",
    "report",
    "sample_window",
    "start_cluster",
    "wait_done",
    "wait_shards_balanced",
    "workdir",
]

console = Console(stderr=True)
HERE = Path(__file__).resolve().parent
PG_ADMIN = os.environ.get("CRONWHEEL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
FINISHED = ("SUCCESS", "FAILED", "DEAD_LETTER", "CANCELLED", "SKIPPED")
# The folder, under a cluster's workdir, where the bench handlers (noop_tasks.py) note
# the instant of their first statement; its name is handed to every process as
# HANDLER_LOG_ENV.
HANDLER_LOG_DIR = "handlers"
HANDLER_LOG_ENV = "CRONWHEEL_BENCH_HANDLER_LOG"


@contextlib.asynccontextmanager
async def fresh_database(backend: str, workdir: Path) -> AsyncIterator[str]:
    """A fresh database URL for one benchmark, dropped afterwards."""
    if backend == "sqlite":
        yield normalise_database_url(f"sqlite:///{workdir / 'bench.db'}")
        return
    name = f"cw_bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(PG_ADMIN)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    try:
        yield normalise_database_url(PG_ADMIN.rsplit("/", 1)[0] + f"/{name}")
    finally:
        conn = await asyncpg.connect(PG_ADMIN)
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


@contextlib.asynccontextmanager
async def bench_cluster(
    backend: str, *, env: Mapping[str, str] | None = None
) -> AsyncIterator[Cluster]:
    """A :class:`Cluster` on a fresh database in a temporary directory; every process
    it started is stopped and the database dropped on the way out. ``env`` is added to
    the environment of every process."""
    with workdir() as wd:
        (wd / HANDLER_LOG_DIR).mkdir()
        async with fresh_database(backend, wd) as url:
            cluster = Cluster(
                database_url=url,
                workdir=wd,
                python_path=[HERE],
                extra_env={HANDLER_LOG_ENV: str(wd / HANDLER_LOG_DIR), **(env or {})},
            )
            try:
                yield cluster
            finally:
                cluster.stop()


def profile(cluster: Cluster, name: str, *, seconds: float, start_at: datetime) -> Any:
    """Record ``seconds`` of py-spy samples of process ``name`` from ``start_at`` on;
    returns a task whose result is the path of the collapsed stacks (flamegraph.pl input)."""

    async def record() -> str:
        delay = (start_at - datetime.now(UTC)).total_seconds() - 0.5
        await asyncio.sleep(max(0.0, delay))
        out = Path.cwd() / f"profile-{name}.txt"
        proc = await asyncio.create_subprocess_exec(
            "py-spy",
            "record",
            "--pid",
            str(cluster.procs[name].pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "200",
            "--output",
            str(out),
            "--nonblocking",
            "--format",
            "raw",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await proc.wait()
        return str(out)

    return asyncio.ensure_future(record())


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="cronwheel-bench-") as d:
        yield Path(d)


async def open_store(url: str) -> Store:
    store = create_store(url)
    await store.open()
    return store


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


# -- creating runs through the API ---------------------------------------------------


async def create_runs(
    cluster: Cluster,
    keys: Sequence[str],
    dues: Sequence[datetime],
    *,
    name: str = "bench",
    batch: int = 500,
    concurrency: int = 4,
    task: str = "noop",
    payload: Mapping[str, Any] | None = None,
    priority: int | None = None,
) -> None:
    """One one-off run (a job with an ``at`` schedule, task ``task`` of ``noop_tasks.py``
    with ``payload``, pool ``bench``, one attempt, ``priority`` or the default) per
    instant of ``dues``, through ``POST /v1/jobs/batch``. Run ``i`` belongs to the tenant
    of ``keys[i % len(keys)]``, so every tenant has runs all over ``dues``."""
    extra: dict[str, Any] = {"payload": dict(payload)} if payload else {}
    if priority is not None:
        extra["priority"] = priority
    per_key: list[list[datetime]] = [list(dues[k :: len(keys)]) for k in range(len(keys))]
    requests = [
        (keys[k], mine[i : i + batch])
        for k, mine in enumerate(per_key)
        for i in range(0, len(mine), batch)
    ]
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=cluster.url, timeout=120) as client:
        with progress_bar() as progress:
            bar = progress.add_task("creating runs", total=len(dues))

            async def send(key: str, instants: list[datetime]) -> None:
                body = {
                    "jobs": [
                        {
                            "name": name,
                            "schedule": {"at": at.isoformat()},
                            "task": task,
                            "pool": "bench",
                            "retry": {"max_attempts": 1},
                            **extra,
                        }
                        for at in instants
                    ]
                }
                async with gate:
                    r = await client.post(
                        "/v1/jobs/batch", json=body, headers={"Authorization": f"Bearer {key}"}
                    )
                    r.raise_for_status()
                progress.advance(bar, len(instants))

            await asyncio.gather(*(send(key, instants) for key, instants in requests))


@dataclass
class Setup:
    """A running cluster ready for runs: tenants, their operator keys, the store."""

    store: Store
    tenant_ids: list[uuid.UUID]
    keys: list[str]  # operator keys, one per tenant


async def start_cluster(
    cluster: Cluster,
    *,
    schedulers: int,
    workers: int,
    concurrency: int,
    tenants: int = 1,
    worker_options: Sequence[str] = (),
) -> Setup:
    """Start the API and scheduler nodes (``cronwheel server`` on SQLite), create
    ``tenants`` tenants and start ``workers`` no-op workers on pool ``bench``: with one
    tenant they use its worker key, with several the admin key (every tenant's runs);
    ``worker_options`` are more of the workers' command-line options."""
    cluster.start_server(schedulers)
    await cluster.wait_ready()
    made = [await cluster.tenant(f"bench-{i}") for i in range(tenants)]
    worker_key = made[0][2] if tenants == 1 else cluster.admin_key
    cluster.start_workers(
        workers,
        worker_key,
        pool="bench",
        module="noop_tasks",
        concurrency=concurrency,
        options=worker_options,
    )
    store = await open_store(cluster.database_url)
    return Setup(
        store=store,
        tenant_ids=[uuid.UUID(tenant_id) for tenant_id, _, _ in made],
        keys=[key for _, key, _ in made],
    )


async def create_ahead(
    cluster: Cluster,
    setup: Setup,
    *,
    lead: float,
    dues: Callable[[datetime], list[datetime]],
    name: str,
) -> datetime:
    """Create the runs ``dues(start)`` through the API, ``start`` being ``lead`` seconds
    from now on the database clock (whole seconds); returns ``start``. Exits when
    creating them took longer than ``lead``."""
    start = (await setup.store.db_now() + timedelta(seconds=lead)).replace(microsecond=0)
    instants = dues(start)
    t0 = time.monotonic()
    await create_runs(cluster, setup.keys, instants, name=name)
    took = time.monotonic() - t0
    if datetime.now(UTC) >= start:
        raise SystemExit(f"creating the runs took {took:.1f} s, past the start; raise --lead")
    console.print(
        f"created {len(instants)} runs in {took:.1f} s ({len(instants) / took:.0f}/s); "
        f"the first due at {start.isoformat()}"
    )
    return start


async def wait_done(store: Store, runs: int, timeout: float) -> bool:
    """Show progress until ``runs`` runs are finished (any end state) or ``timeout``
    seconds passed; True when they all finished."""
    deadline = time.monotonic() + timeout
    with progress_bar() as progress:
        bar = progress.add_task("runs finished", total=runs)
        while True:
            counts = await store.runs_count_by_state()
            finished = sum(counts.get(s, 0) for s in FINISHED)
            progress.update(bar, completed=finished)
            if finished >= runs:
                return True
            if time.monotonic() > deadline:
                console.print(f"[red]timed out[/]: {finished} of {runs} runs finished")
                return False
            await asyncio.sleep(0.25)


async def wait_shards_balanced(store: Store, nodes: int, timeout: float = 60.0) -> dict[str, int]:
    """Wait until ``nodes`` scheduler nodes hold every shard between them, none more than
    its fair share (shards / nodes, rounded up, as the nodes count it); returns shards
    held per node."""
    deadline = time.monotonic() + timeout
    share = -(-NUM_SHARDS // nodes)
    while True:
        now = await store.db_now()
        held: dict[str, int] = {}
        try:
            leases = await store.shard_leases_list()
        except Exception:  # the nodes are still creating the schema
            leases = []
        for lease in leases:
            if lease["owner"] and lease["expires_at"] > now:
                held[lease["owner"]] = held.get(lease["owner"], 0) + 1
        if len(held) == nodes and sum(held.values()) == NUM_SHARDS and max(held.values()) <= share:
            return held
        if time.monotonic() > deadline:
            raise RuntimeError(f"shard leases did not settle among {nodes} nodes: {held}")
        await asyncio.sleep(0.25)


# -- what happened ---------------------------------------------------------------------


@dataclass
class History:
    """Every run of the benchmark's tenants, and each run's SCHEDULED→DISPATCHED
    events (one, when dispatch was exactly-once)."""

    runs: list[Run]
    dispatches: dict[uuid.UUID, list[Event]] = field(default_factory=dict)

    def lost(self, expected: int) -> int:
        """Runs that should have succeeded and did not (or were never seen)."""
        return expected - sum(1 for r in self.runs if r.state.value == "SUCCESS")

    def dispatched_twice(self) -> int:
        """Runs with more than one SCHEDULED→DISPATCHED transition."""
        return sum(1 for events in self.dispatches.values() if len(events) > 1)

    def run_twice(self) -> int:
        """Runs that had a second attempt or were dispatched twice."""
        return sum(1 for r in self.runs if r.attempt > 1 or len(self.dispatches.get(r.id, ())) > 1)


async def collect(store: Store, tenant_ids: Sequence[uuid.UUID]) -> History:
    history = History(runs=[])
    for tenant_id in tenant_ids:
        cursor = None
        while True:
            page = await store.runs_list(tenant_id, filter=RunFilter(), cursor=cursor, limit=1000)
            history.runs += page.items
            if not page.next_cursor:
                break
            cursor = page.next_cursor
        cursor = None
        while True:
            events = await store.events_list(tenant_id, cursor=cursor, limit=5000)
            for e in events.items:
                if e.from_state == "SCHEDULED" and e.to_state == "DISPATCHED" and e.run_id:
                    history.dispatches.setdefault(e.run_id, []).append(e)
            if not events.next_cursor:
                break
            cursor = events.next_cursor
    return history


def lateness_ms(runs: Sequence[Run]) -> tuple[list[float], list[float]]:
    """Dispatch lateness (dispatched_at - due_at) and start lateness (started_at - due_at)
    of ``runs``, in milliseconds."""
    dispatch = [
        (r.dispatched_at - r.due_at).total_seconds() * 1000 for r in runs if r.dispatched_at
    ]
    start = [(r.started_at - r.due_at).total_seconds() * 1000 for r in runs if r.started_at]
    return dispatch, start


def handler_starts(cluster: Cluster) -> dict[uuid.UUID, list[float]]:
    """When each run's handler began (its first statement, time.time() in the worker),
    from the notes of ``noop_tasks.py``'s handlers: run id → one instant per execution
    (two: it ran twice). Read once the runs have finished: each note is written before
    the handler returns."""
    starts: dict[uuid.UUID, list[float]] = {}
    for path in sorted((cluster.workdir / HANDLER_LOG_DIR).glob("*.tsv")):
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) == 3:  # a line still being written when a worker was killed
                starts.setdefault(uuid.UUID(fields[0]), []).append(float(fields[2]))
    return starts


def handler_lateness_ms(
    runs: Sequence[Run], starts: Mapping[uuid.UUID, list[float]]
) -> list[float]:
    """Start lateness at the handler (its first execution's first statement - due_at) of
    those of ``runs`` whose handler ran, in milliseconds."""
    return [(min(starts[r.id]) - r.due_at.timestamp()) * 1000 for r in runs if starts.get(r.id)]


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"min": None, "p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return {
        "min": round(ordered[0], 2),
        "p50": round(statistics.median(ordered), 2),
        "p90": round(pick(0.90), 2),
        "p99": round(pick(0.99), 2),
        "max": round(ordered[-1], 2),
    }


# -- processes -------------------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ProcSample:
    """What a process has used so far, from ``/proc`` (Linux)."""

    at: float  # time.monotonic()
    cpu_s: float  # user + system time
    rss_bytes: int
    peak_rss_bytes: int  # the high-water mark since the process started

    def cpu_percent_since(self, earlier: ProcSample) -> float:
        """Share of one core used between ``earlier`` and this sample, in percent."""
        return 100 * (self.cpu_s - earlier.cpu_s) / max(1e-9, self.at - earlier.at)


def proc_sample(pid: int) -> ProcSample:
    at = time.monotonic()
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces; the fields after its ")" are fixed.
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    peak = rss
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    return ProcSample(at=at, cpu_s=cpu, rss_bytes=rss, peak_rss_bytes=peak)


def add_ahead_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that hand runs out ahead of their instant (see ``ahead_env``)."""
    parser.add_argument(
        "--dispatch-lead",
        type=float,
        default=None,
        help="the schedulers' CRONWHEEL_DISPATCH_LEAD: dispatch this many seconds ahead "
        "(runs wait in the ready queue, or reserved by a worker, until their instant)",
    )
    parser.add_argument(
        "--lease-ahead",
        type=float,
        default=None,
        help="the API's CRONWHEEL_LEASE_AHEAD_MAX: workers reserve runs dispatched ahead "
        "up to this many seconds before their instant and start them at it",
    )


def ahead_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment of every process for ``add_ahead_arguments``'s options (the
    settings' defaults where not given)."""
    env: dict[str, str] = {}
    if args.dispatch_lead is not None:
        env["CRONWHEEL_DISPATCH_LEAD"] = str(args.dispatch_lead)
    if args.lease_ahead is not None:
        env["CRONWHEEL_LEASE_AHEAD_MAX"] = str(args.lease_ahead)
    return env


def histogram(values: list[float], width: float) -> dict[str, int]:
    """How many ``values`` fall in each ``width``-wide bucket, keyed by its lower edge."""
    counts: dict[float, int] = {}
    for v in values:
        edge = width * (v // width)
        counts[edge] = counts.get(edge, 0) + 1
    return {f"{edge:g}": counts[edge] for edge in sorted(counts)}


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from ``/proc/stat``."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / _CLK_TCK, sum(fields) / _CLK_TCK


async def sample_window(cluster: Cluster, start: datetime, seconds: float) -> dict[str, float]:
    """CPU used by each process from ``start`` for ``seconds``, in percent of one core,
    and by the whole machine (``machine``: all cores, PostgreSQL included)."""
    await asyncio.sleep(max(0.0, (start - datetime.now(start.tzinfo)).total_seconds()))
    first = {name: proc_sample(proc.pid) for name, proc in cluster.procs.items()}
    busy0, total0 = machine_busy()
    await asyncio.sleep(seconds)
    busy1, total1 = machine_busy()
    usage: dict[str, float] = {}
    for name, earlier in first.items():
        proc = cluster.procs.get(name)
        if proc is not None and proc.poll() is None:
            later: ProcSample = proc_sample(proc.pid)
            usage[name] = round(later.cpu_percent_since(earlier), 1)
    cores = os.cpu_count() or 1
    usage["machine"] = round(100 * cores * (busy1 - busy0) / max(1e-9, total1 - total0), 1)
    return usage


# -- output ----------------------------------------------------------------------------


def report(
    title: str, result: dict[str, Any], rows: Sequence[tuple[str, ...]], header: tuple[str, ...]
) -> None:
    """JSON on stdout (for machines), a table on stderr (for people)."""
    print(json.dumps(result, indent=2, default=str))
    print_table(title, rows, header)


def print_table(title: str, rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> None:
    """A table on stderr, the first column left-aligned; short rows are padded."""
    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="right" if h != header[0] else "left")
    for row in rows:
        table.add_row(*row, *[""] * (len(header) - len(row)))
    console.print(table)
