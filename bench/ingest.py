"""Ingest: how fast one ``cronwheel api`` process creates jobs.

Starts a real ``cronwheel api`` on a fresh PostgreSQL database (synchronous commit, as
the server has it) or ``cronwheel server`` on SQLite, makes one tenant, and times three
phases, each on its own:

* **concurrent**: C clients, each sending single ``POST /v1/jobs`` one after the other
  on its own keep-alive connection, N creates in all;
* **sequential**: one client sending S single creates one after the other;
* **batches**: B ``POST /v1/jobs/batch`` of J jobs each, one after the other (or from K
  clients at once, ``--batch-clients``).

Every job is one-off, due a minute ahead (so its run is announced to the schedulers, as
most new runs are). The clients speak plain HTTP/1.1 over asyncio streams: a client as
thin as this measures the server, not the client library. Server time is read from the
API's ``Server-Timing`` header where it sends one, and from its request-duration
histogram (``/metrics``, interpolated within buckets) always.

    python bench/ingest.py --concurrent 8 --creates 6000 --sequential 2000 --batches 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Sequence
from typing import Any

import httpx
from harness import Cluster, ProcSample, bench_cluster, console, percentiles, proc_sample, report

_TIMING = re.compile(rb"server-timing:\s*app;dur=([0-9.]+)", re.IGNORECASE)


class Connection:
    """One keep-alive HTTP/1.1 connection that sends prepared requests and reads each
    answer whole (Content-Length bodies only, as the API sends them)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, request: bytes) -> tuple[int, bytes, float | None]:
        """The status, body and Server-Timing duration (ms) of the answer to ``request``."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        body = await self.reader.readexactly(length)
        timing = _TIMING.search(head)
        return status, body, float(timing.group(1)) if timing else None

    def close(self) -> None:
        self.writer.close()


def post(path: str, key: str, body: Any) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


def job(i: int) -> dict[str, Any]:
    return {
        "name": f"ingest-{i}",
        "schedule": {"delay": 60},
        "task": "noop",
        "pool": "bench",
        "payload": {"n": i},
    }


class Phase:
    """What one phase measured: client latency and server time per request (ms)."""

    def __init__(self) -> None:
        self.latency: list[float] = []
        self.server: list[float] = []
        self.errors: dict[int, int] = {}

    def note(self, status: int, took: float, server: float | None, ok: int) -> None:
        if status != ok:
            self.errors[status] = self.errors.get(status, 0) + 1
        self.latency.append(took * 1000)
        if server is not None:
            self.server.append(server)


async def singles(port: int, key: str, *, clients: int, creates: int) -> tuple[Phase, float]:
    """``creates`` single creates from ``clients`` clients; the phase and its seconds."""
    phase = Phase()
    conns = [await Connection.open(port) for _ in range(clients)]
    counter = iter(range(creates))

    async def client(conn: Connection) -> None:
        for i in counter:
            request = post("/v1/jobs", key, job(i))
            t0 = time.perf_counter()
            status, body, server = await conn.send(request)
            phase.note(status, time.perf_counter() - t0, server, 201)
            if status != 201 and len(phase.errors) == 1 and sum(phase.errors.values()) == 1:
                console.print(f"[red]{status}[/] {body[:300]!r}")

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    took = time.perf_counter() - started
    for c in conns:
        c.close()
    return phase, took


async def batches(
    port: int, key: str, *, count: int, size: int, clients: int = 1
) -> tuple[Phase, float]:
    """``count`` batches of ``size`` jobs from ``clients`` clients, each sending its
    next batch when the last is answered; the phase and its seconds."""
    phase = Phase()
    conns = [await Connection.open(port) for _ in range(clients)]
    requests = iter(
        [
            post("/v1/jobs/batch", key, {"jobs": [job(b * size + i) for i in range(size)]})
            for b in range(count)
        ]
    )

    async def client(conn: Connection) -> None:
        for request in requests:
            t0 = time.perf_counter()
            status, body, server = await conn.send(request)
            phase.note(status, time.perf_counter() - t0, server, 201)
            if status != 201:
                console.print(f"[red]{status}[/] {body[:300]!r}")

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    took = time.perf_counter() - started
    for c in conns:
        c.close()
    return phase, took


# -- the request-duration histogram --------------------------------------------------


async def histogram(cluster: Cluster, route: str) -> dict[float, float]:
    """Cumulative counts of ``route``'s request-duration buckets, by upper bound (s)."""
    async with httpx.AsyncClient(base_url=cluster.url) as client:
        text = (
            await client.get("/metrics", headers={"Authorization": f"Bearer {cluster.admin_key}"})
        ).text
    out: dict[float, float] = {}
    pattern = re.compile(
        r'^cronwheel_api_request_duration_seconds_bucket\{le="([^"]+)",route="([^"]+)"\} (\S+)$'
    )
    for line in text.splitlines():
        m = pattern.match(line)
        if m is None:
            m2 = re.match(
                r'^cronwheel_api_request_duration_seconds_bucket\{route="([^"]+)",le="([^"]+)"\}'
                r" (\S+)$",
                line,
            )
            if m2 is None:
                continue
            found_route, le, value = m2.group(1), m2.group(2), m2.group(3)
        else:
            le, found_route, value = m.group(1), m.group(2), m.group(3)
        if found_route == route:
            out[float("inf") if le == "+Inf" else float(le)] = float(value)
    return out


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> Any:
    """The ``q`` quantile (ms) of the requests between two scrapes, interpolated
    linearly within its bucket (as Prometheus' histogram_quantile does)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return round(lower * 1000, 3)
            share = (rank - below) / max(1e-9, count - below)
            return round((lower + (bound - lower) * share) * 1000, 3)
        lower, below = bound, count
    return None


def _postgres_cpu() -> float:
    """CPU seconds used so far by every PostgreSQL process of the machine (its backends,
    the WAL writer, ...): what the database costs, as far as nothing else uses it."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/comm") as f:
                if f.read().strip() != "postgres":
                    continue
            total += proc_sample(int(entry.name)).cpu_s
        except OSError:
            continue
    return total


class CpuMeter:
    """The CPU the API process, PostgreSQL and this client used during a phase."""

    def __init__(self, api_pid: int) -> None:
        self.api_pid = api_pid
        self.api: ProcSample = proc_sample(api_pid)
        self.db = _postgres_cpu()
        self.client = time.process_time()

    def per_job(self, jobs: int) -> dict[str, float]:
        """Milliseconds of CPU per job since the meter started, by process."""
        api = proc_sample(self.api_pid).cpu_s - self.api.cpu_s
        db = _postgres_cpu() - self.db
        client = time.process_time() - self.client
        return {
            "api": round(api * 1000 / jobs, 3),
            "postgres": round(db * 1000 / jobs, 3),
            "client": round(client * 1000 / jobs, 3),
        }


def summary(
    name: str,
    phase: Phase,
    seconds: float,
    jobs: int,
    hist: tuple[Any, Any],
    cpu: dict[str, float],
) -> dict[str, Any]:
    return {
        "phase": name,
        "jobs": jobs,
        "requests": len(phase.latency),
        "seconds": round(seconds, 3),
        "jobs_per_s": round(jobs / seconds, 1),
        "errors": phase.errors,
        "client_ms": percentiles(phase.latency),
        "server_ms": percentiles(phase.server) if phase.server else None,
        "server_ms_from_histogram": {
            "p50": histogram_quantile(*hist, 0.5),
            "p99": histogram_quantile(*hist, 0.99),
        },
        "cpu_ms_per_job": cpu,
    }


async def _spy(cluster: Cluster, name: str) -> asyncio.subprocess.Process:
    """py-spy sampling the API process until :func:`_spy_stop`; the collapsed stacks go
    to ``profile-<name>.txt`` in the working directory."""
    proc = await asyncio.create_subprocess_exec(
        "py-spy",
        "record",
        "--pid",
        str(cluster.pid(next(iter(cluster.procs)))),
        "--rate",
        "250",
        "--output",
        f"profile-{name}.txt",
        "--format",
        "raw",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await asyncio.sleep(0.5)  # attached before the phase begins
    return proc


async def _spy_stop(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
    await proc.wait()


async def main(args: argparse.Namespace) -> None:
    # The per-key rate limit (100/s by default) would measure itself: raised far above
    # what the phases send, so it is still checked on every request but never refuses.
    env = {"CRONWHEEL_RATE_LIMIT": "1000000", "CRONWHEEL_RATE_LIMIT_BURST": "1000000"}
    async with bench_cluster(args.backend, env=env) as cluster:
        cluster.start_server(0)
        await cluster.wait_ready()
        _tenant, key, _ = await cluster.tenant("ingest")
        api_pid = cluster.pid(next(iter(cluster.procs)))
        # Warm up: connections in the pool, statements prepared, code paths taken.
        await singles(cluster.port, key, clients=args.concurrent, creates=args.warmup)
        await batches(cluster.port, key, count=2, size=min(args.batch_size, 100))
        results: list[dict[str, Any]] = []
        phases: Sequence[tuple[str, str, Any, int]] = (
            (
                f"concurrent ({args.concurrent} clients)",
                "/v1/jobs",
                lambda: singles(cluster.port, key, clients=args.concurrent, creates=args.creates),
                args.creates,
            ),
            (
                "sequential (1 client)",
                "/v1/jobs",
                lambda: singles(cluster.port, key, clients=1, creates=args.sequential),
                args.sequential,
            ),
            (
                f"batches of {args.batch_size}"
                + (f" ({args.batch_clients} clients)" if args.batch_clients > 1 else ""),
                "/v1/jobs/batch",
                lambda: batches(
                    cluster.port,
                    key,
                    count=args.batches,
                    size=args.batch_size,
                    clients=args.batch_clients,
                ),
                args.batches * args.batch_size,
            ),
        )
        for index, (name, route, run, jobs) in enumerate(phases):
            before = await histogram(cluster, route)
            spy = await _spy(cluster, f"ingest-{index}") if args.profile else None
            meter = CpuMeter(api_pid)
            phase, seconds = await run()
            cpu = meter.per_job(jobs)
            if spy is not None:
                await _spy_stop(spy)
            after = await histogram(cluster, route)
            results.append(summary(name, phase, seconds, jobs, (before, after), cpu))
            console.print(f"{name}: {jobs / seconds:,.0f} jobs/s")
        cluster.check_alive()
    rows = [
        (
            r["phase"],
            f"{r['jobs_per_s']:,.0f}",
            str(r["client_ms"]["p50"]),
            str(r["client_ms"]["p99"]),
            str(r["server_ms"]["p50"]) if r["server_ms"] else "-",
            str(r["server_ms_from_histogram"]["p50"]),
            str(sum(r["errors"].values())),
            " / ".join(str(v) for v in r["cpu_ms_per_job"].values()),
        )
        for r in results
    ]
    report(
        f"ingest, {args.backend}",
        {"backend": args.backend, "phases": results},
        rows,
        (
            "phase",
            "jobs/s",
            "client p50 ms",
            "client p99 ms",
            "server p50 ms (header)",
            "server p50 ms (histogram)",
            "errors",
            "CPU ms per job: api / postgres / client",
        ),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="postgresql")
    parser.add_argument("--concurrent", type=int, default=8, help="clients in the first phase")
    parser.add_argument("--creates", type=int, default=6000, help="single creates, concurrent")
    parser.add_argument("--sequential", type=int, default=2000, help="single creates, 1 client")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument(
        "--batch-clients", type=int, default=1, help="clients sending batches at once"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record py-spy samples of the API during each phase (profile-ingest-N.txt)",
    )
    parser.add_argument("--warmup", type=int, default=400, help="single creates before timing")
    asyncio.run(main(parser.parse_args()))
