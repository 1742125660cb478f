"""Shared machinery of the benchmarks: start real cronwheel processes on a fresh
database, create a tenant and keys through the API, collect run histories, and print
JSON plus a table. Benchmarks run the product as users do: the CLI and the HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from rich.console import Console
from rich.table import Table

from cronwheel.settings import normalise_database_url
from cronwheel.store import Store, create_store
from cronwheel.testing import Cluster

__all__ = [
    "HERE",
    "Cluster",
    "console",
    "fresh_database",
    "open_store",
    "percentiles",
    "report",
    "workdir",
]

console = Console(stderr=True)
HERE = Path(__file__).resolve().parent
PG_ADMIN = os.environ.get("CRONWHEEL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


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


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return {
        "p50": round(statistics.median(ordered), 2),
        "p99": round(pick(0.99), 2),
        "max": round(ordered[-1], 2),
    }


def report(
    title: str, result: dict[str, Any], rows: list[tuple[str, ...]], header: tuple[str, ...]
) -> None:
    """JSON on stdout (for machines), a table on stderr (for people)."""
    print(json.dumps(result, indent=2, default=str))
    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="right" if h != header[0] else "left")
    for row in rows:
        table.add_row(*row)
    console.print(table)
