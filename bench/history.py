"""History: how fast ``GET /v1/runs`` pages through a tenant with a million runs.

Starts a real ``cronwheel api`` on a fresh PostgreSQL database, makes one tenant with J
jobs (through ``POST /v1/jobs/batch``) and fills it with N runs, set-based in SQL from
those jobs' first runs: due one every few seconds back from now, a spread of states
(mostly SUCCESS, some FAILED, DEAD_LETTER, CANCELLED, SKIPPED; the newest scheduled or
dispatched), pools (default, etl, gpu) and tags (``nightly``, ``eu``), beside T other
tenants with N/10 runs each. Then, through the real HTTP API, for several listings (all,
by state, by two states, by job, by a one-day window, by tag, by pool, every tenant's
with the admin key): the first page and the 100th (its cursor found by walking there),
each read R times — p50 / p99 / max ms at the client.

Last, pages are walked while runs are added — new ones at the top through the API, old
ones among the pages not yet read straight into the database — and checked: no run read
twice, every run there at the start read in order, none of the new top ones read.

    python bench/history.py --runs 1000000 --repeats 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
from harness import bench_cluster, console, percentiles, print_table, progress_bar, report
from sqlalchemy import event

from cronwheel.store import RunFilter, Store, create_store
from cronwheel.store.sql import SqlStore

PAGE = 100
DEEP = 100  # the page timed after the first
# Pages of the tenant walked while runs are added, and how many are added each round.
WALK_PAGES = 50
ADD_TOP = 20
ADD_INSIDE = 20


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def make_jobs(client: httpx.AsyncClient, key: str, count: int) -> list[str]:
    """``count`` one-off jobs due a year ahead (their first runs are the templates);
    returns their ids."""
    at = (datetime.now(UTC) + timedelta(days=365)).isoformat()
    ids: list[str] = []
    for start in range(0, count, 500):
        body = {
            "jobs": [
                {"name": f"history-{i}", "schedule": {"at": at}, "task": "noop"}
                for i in range(start, min(count, start + 500))
            ]
        }
        r = await client.post("/v1/jobs/batch", json=body, headers=_auth(key))
        r.raise_for_status()
        ids += [item["id"] for item in r.json()["items"]]
    return ids


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# One run per i of a chunk: the template of job i mod J, due ``spacing`` earlier for
# each i (so the job's runs never share a due instant), its state, pool and tags drawn
# from a hash of i. Finished runs finished a second after their due instant.
_FILL = """
WITH templates AS (
    SELECT r.*, (row_number() OVER (ORDER BY r.job_id) - 1)::int AS k
    FROM runs r WHERE r.tenant_id = $1::uuid
), picked AS (
    SELECT t.*, i, (i * 7919 + i / 97) % 100 AS h,
           $3::timestamptz - (i * $4::bigint) * interval '1 microsecond' AS due
    FROM generate_series($5::bigint, $6::bigint) AS i
    JOIN templates t ON t.k = i % $2::int
), staged AS (
    SELECT p.*,
        CASE WHEN i < $7::bigint THEN (CASE WHEN h < 50 THEN 'SCHEDULED' ELSE 'DISPATCHED' END)
             WHEN h < 80 THEN 'SUCCESS' WHEN h < 88 THEN 'FAILED' WHEN h < 90 THEN 'DEAD_LETTER'
             WHEN h < 95 THEN 'CANCELLED' ELSE 'SKIPPED' END AS st
    FROM picked p
)
INSERT INTO runs (
    id, tenant_id, job_id, job_name, origin, shard, state, due_at, due_local, fire_at,
    priority, pool, requires, tags, route_tags, task, webhook, payload, attempt,
    max_attempts, retry, timeout, heartbeat_timeout, progress_timeout, created_at,
    dispatched_at, started_at, finished_at, last_error
)
SELECT
    md5(tenant_id::text || i::text)::uuid, tenant_id, job_id, job_name, 'schedule', shard,
    st, due, NULL, due, priority,
    CASE WHEN h % 20 = 0 THEN 'gpu' WHEN h % 5 = 1 THEN 'etl' ELSE 'default' END,
    requires,
    CASE WHEN i % 10 = 0 THEN '["nightly"]'::jsonb WHEN i % 10 = 1 THEN '["nightly", "eu"]'
         ELSE '[]'::jsonb END,
    route_tags, task, webhook, payload,
    CASE WHEN st IN ('SCHEDULED', 'SKIPPED') THEN 0 ELSE 1 END,
    max_attempts, retry, timeout, heartbeat_timeout, progress_timeout,
    due - interval '1 minute',
    CASE WHEN st IN ('SCHEDULED', 'SKIPPED') THEN NULL ELSE due END,
    CASE WHEN st IN ('SCHEDULED', 'SKIPPED', 'DISPATCHED') THEN NULL ELSE due END,
    CASE WHEN st IN ('SCHEDULED', 'DISPATCHED') THEN NULL ELSE due + interval '1 second' END,
    CASE WHEN st IN ('FAILED', 'DEAD_LETTER') THEN 'boom' END
FROM staged
"""


async def fill(
    conn: asyncpg.Connection, tenant_id: str, jobs: int, runs: int, end: datetime, span: float
) -> None:
    spacing = max(1, int(span * 1_000_000 / max(1, runs)))
    chunk = 100_000
    fresh = max(1, runs // 1000)  # the newest 0.1 % still to run
    with progress_bar() as bar:
        task = bar.add_task(f"runs of {tenant_id[:8]}", total=runs)
        for lo in range(0, runs, chunk):
            hi = min(runs, lo + chunk) - 1
            await conn.execute(_FILL, tenant_id, jobs, end, spacing, lo, hi, fresh)
            bar.update(task, completed=hi + 1)


async def timed(
    client: httpx.AsyncClient, headers: dict[str, str], params: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    r = await client.get("/v1/runs", params=params, headers=headers)
    ms = (time.perf_counter() - started) * 1000
    r.raise_for_status()
    page: dict[str, Any] = r.json()
    return ms, page


async def measure(
    client: httpx.AsyncClient,
    name: str,
    headers: dict[str, str],
    params: dict[str, Any],
    repeats: int,
) -> dict[str, Any]:
    """The first page and page ``DEEP`` (or the last there is) of one listing."""
    firsts: list[float] = []
    page: dict[str, Any] = {}
    for _ in range(repeats):
        ms, page = await timed(client, headers, {**params, "limit": PAGE})
        firsts.append(ms)
    # Walk to page DEEP (or the last): ``reached`` is the cursor that reads it.
    cursor, number, reached = page["next_cursor"], 1, None
    walk_started = time.perf_counter()
    while cursor and number < DEEP:
        reached = cursor
        _ms, page = await timed(client, headers, {**params, "limit": PAGE, "cursor": cursor})
        cursor, number = page["next_cursor"], number + 1
    walked_s = time.perf_counter() - walk_started
    deep: list[float] = []
    if reached:
        for _ in range(repeats):
            ms, page = await timed(client, headers, {**params, "limit": PAGE, "cursor": reached})
            deep.append(ms)
    console.print(
        f"  {name}: page 1 p50 {percentiles(firsts)['p50']} ms, page {number} "
        f"p50 {percentiles(deep)['p50']} ms",
        highlight=False,
    )
    return {
        "listing": name,
        "params": params,
        "first_page_ms": percentiles(firsts),
        "deep_page": number if deep else None,
        "deep_page_ms": percentiles(deep),
        "walk_s": round(walked_s, 2),
        "deep_cursor": reached,
    }


async def walk_while_adding(
    client: httpx.AsyncClient,
    conn: asyncpg.Connection,
    tenant_id: str,
    key: str,
    pages: int,
) -> dict[str, Any]:
    """Walk ``pages`` pages while a writer adds runs at the top (API) and among the
    pages not read yet (SQL); check no duplicates, no gaps, no new top run read."""
    expected_rows = await conn.fetch(
        "SELECT id::text, due_at FROM runs WHERE tenant_id = $1::uuid "
        "ORDER BY due_at DESC, id DESC LIMIT $2",
        tenant_id,
        pages * PAGE,
    )
    expected = [r["id"] for r in expected_rows]
    oldest = expected_rows[-1]["due_at"]
    end = (oldest, uuid.UUID(expected[-1]))
    # Runs added inside land among the filled history (not among the jobs' first runs,
    # due a year ahead): between the last expected run and now.
    newest = datetime.now(UTC)
    template = await conn.fetchval(
        "SELECT id FROM runs WHERE tenant_id = $1::uuid AND state = 'SUCCESS' LIMIT 1", tenant_id
    )
    added_top: list[str] = []
    added_inside: list[str] = []
    stop = asyncio.Event()
    rnd = random.Random(7)

    async def writer() -> None:
        round_ = 0
        while not stop.is_set():
            round_ += 1
            at = (datetime.now(UTC) + timedelta(days=400, seconds=round_)).isoformat()
            body = {
                "jobs": [
                    {"name": f"top-{round_}-{i}", "schedule": {"at": at}, "task": "noop"}
                    for i in range(ADD_TOP)
                ]
            }
            r = await client.post("/v1/jobs/batch", json=body, headers=_auth(key))
            r.raise_for_status()
            added_top.extend(item["first_run_id"] for item in r.json()["items"])
            span = (newest - oldest).total_seconds()
            dues = [oldest + timedelta(seconds=rnd.uniform(0, span)) for _ in range(ADD_INSIDE)]
            rows = await conn.fetch(
                "INSERT INTO runs SELECT (r).* FROM ("
                " SELECT jsonb_populate_record(NULL::runs, to_jsonb(t) || jsonb_build_object("
                "  'id', gen_random_uuid(), 'due_at', d, 'fire_at', d, 'finished_at', d)) AS r"
                " FROM runs t, unnest($2::timestamptz[]) AS d WHERE t.id = $1) AS x "
                "ON CONFLICT DO NOTHING RETURNING id::text",
                template,
                dues,
            )
            added_inside.extend(r["id"] for r in rows)
            await asyncio.sleep(0.02)

    writing = asyncio.create_task(writer())
    seen: list[tuple[str, str]] = []
    cursor: str | None = None
    started = time.perf_counter()
    try:
        # Until past the last run expected: runs added inside push it further down.
        while True:
            params: dict[str, Any] = {"limit": PAGE, **({"cursor": cursor} if cursor else {})}
            _ms, page = await timed(client, _auth(key), params)
            seen += [(run["id"], run["due_at"]) for run in page["items"]]
            cursor = page["next_cursor"]
            last = page["items"][-1]
            if not cursor or (_instant(last["due_at"]), uuid.UUID(last["id"])) <= end:
                break
            await asyncio.sleep(0.01)  # let the writer in between pages
    finally:
        stop.set()
        await writing
    ids = [i for i, _ in seen]
    expected_set = set(expected)
    in_order = [i for i in ids if i in expected_set]
    reached = in_order == expected
    positions = [(_instant(d), uuid.UUID(i)) for i, d in seen]
    ordered = positions == sorted(positions, reverse=True)
    top = set(added_top) & set(ids)
    inside = set(added_inside) & set(ids)
    return {
        "pages_expected": pages,
        "runs_read": len(ids),
        "read_in_history_order": ordered,
        "duplicates": len(ids) - len(set(ids)),
        "expected_runs": len(expected),
        "expected_read_in_order": reached,
        "missing": len(expected_set - set(ids)),
        "added_at_the_top": len(added_top),
        "added_at_the_top_read": len(top),
        "added_inside": len(added_inside),
        "added_inside_read": len(inside),
        "seconds": round(time.perf_counter() - started, 2),
        "ok": reached and ordered and len(ids) == len(set(ids)) and not top,
    }


def run_filter(params: dict[str, Any]) -> RunFilter:
    """The store's filter for a listing's query parameters."""
    return RunFilter(
        job_id=uuid.UUID(params["job_id"]) if "job_id" in params else None,
        states=params["state"].split(",") if "state" in params else None,
        since=_instant(params["since"]) if "since" in params else None,
        until=_instant(params["until"]) if "until" in params else None,
        tags=[params["tag"]] if "tag" in params else (),
        pool=params.get("pool"),
    )


def _walk_plan(node: dict[str, Any]) -> list[str]:
    here = []
    if "Relation Name" in node:
        index = f" using {node['Index Name']}" if node.get("Index Name") else ""
        backward = " Backward" if node.get("Scan Direction") == "Backward" else ""
        here.append(f"{node['Node Type']}{backward}{index} on {node['Relation Name']}")
    elif "Sort" in node["Node Type"]:
        here.append(node["Node Type"])
    for child in node.get("Plans", []):
        here += _walk_plan(child)
    return here


async def explain(
    store: Store, tenant_id: uuid.UUID | None, params: dict[str, Any], cursor: str | None
) -> dict[str, Any]:
    """What the store's statement for one page does in PostgreSQL: its scans (and
    sorts), the buffers it touched and its execution time (``EXPLAIN ANALYZE``)."""
    assert isinstance(store, SqlStore)
    caught: list[tuple[str, Any]] = []

    def catch(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "FROM runs" in statement:
            caught.append((statement, parameters))

    event.listen(store.engine.sync_engine, "before_cursor_execute", catch)
    try:
        await store.runs_list(tenant_id, filter=run_filter(params), cursor=cursor, limit=PAGE)
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", catch)
    [(statement, parameters)] = caught
    async with store.engine.connect() as conn:
        rows = await conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", parameters
        )
        doc = rows.scalar_one()
    top = (json.loads(doc) if isinstance(doc, str) else doc)[0]
    root = top["Plan"]
    return {
        "nodes": _walk_plan(root),
        "buffers": int(root.get("Shared Hit Blocks", 0)) + int(root.get("Shared Read Blocks", 0)),
        "ms": round(float(top["Execution Time"]), 2),
    }


async def main(args: argparse.Namespace) -> None:
    env = {"CRONWHEEL_RATE_LIMIT": "1000000", "CRONWHEEL_RATE_LIMIT_BURST": "1000000"}
    async with bench_cluster("postgresql", env=env) as cluster:
        cluster.start_server(0)  # the API alone: nothing moves the runs
        await cluster.wait_ready()
        conn = await asyncpg.connect(_dsn(cluster.database_url))
        admin = _auth(cluster.admin_key)
        async with httpx.AsyncClient(base_url=cluster.url, timeout=120) as client:
            tenant_id, key, _ = await cluster.tenant("history")
            others = [await cluster.tenant(f"other-{i}") for i in range(args.tenants)]
            jobs = await make_jobs(client, key, args.jobs)
            end = datetime.now(UTC)
            fill_started = time.monotonic()
            await fill(conn, tenant_id, args.jobs, args.runs, end, args.days * 86400)
            for other_id, other_key, _ in others:
                await make_jobs(client, other_key, max(1, args.jobs // 10))
                await fill(
                    conn,
                    other_id,
                    max(1, args.jobs // 10),
                    args.runs // 10,
                    end,
                    args.days * 86400,
                )
            with console.status("VACUUM ANALYZE runs"):
                await conn.execute("VACUUM ANALYZE runs")
            fill_s = time.monotonic() - fill_started
            total = await conn.fetchval("SELECT count(*) FROM runs")
            size = await conn.fetchval("SELECT pg_size_pretty(pg_total_relation_size('runs'))")
            console.print(f"{total:,} runs ({size}) in {fill_s:.0f} s", highlight=False)

            day = end - timedelta(days=args.days / 2)
            mine = _auth(key)
            listings: list[tuple[str, dict[str, str], dict[str, Any]]] = [
                ("all", mine, {}),
                ("state=FAILED", mine, {"state": "FAILED"}),
                ("state=DEAD_LETTER", mine, {"state": "DEAD_LETTER"}),
                ("state=FAILED,DEAD_LETTER", mine, {"state": "FAILED,DEAD_LETTER"}),
                ("job_id", mine, {"job_id": jobs[0]}),
                (
                    "one-day window",
                    mine,
                    {"since": day.isoformat(), "until": (day + timedelta(days=1)).isoformat()},
                ),
                ("tag=eu", mine, {"tag": "eu"}),
                ("pool=gpu", mine, {"pool": "gpu"}),
                ("pool=gpu&state=FAILED", mine, {"pool": "gpu", "state": "FAILED"}),
                ("admin: every tenant", admin, {}),
                ("admin: every tenant, state=FAILED", admin, {"state": "FAILED"}),
            ]
            results = [
                await measure(client, name, headers, params, args.repeats)
                for name, headers, params in listings
            ]
            store = create_store(cluster.database_url, pool_size=1, pool_overflow=0)
            await store.open()
            try:
                for (_name, headers, params), result in zip(listings, results, strict=True):
                    tenant = None if headers is admin else uuid.UUID(tenant_id)
                    result["plan_first_page"] = await explain(store, tenant, params, None)
                    deep = result.pop("deep_cursor")
                    if deep:
                        result["plan_deep_page"] = await explain(store, tenant, params, deep)
            finally:
                await store.close()
            with console.status("walking pages while runs are added"):
                walk = await walk_while_adding(client, conn, tenant_id, key, args.walk_pages)
        await conn.close()

    result = {
        "runs": total,
        "tenant_runs": args.runs,
        "other_tenants": args.tenants,
        "jobs": args.jobs,
        "days": args.days,
        "fill_s": round(fill_s, 1),
        "runs_table": size,
        "page_size": PAGE,
        "repeats": args.repeats,
        "listings": results,
        "walk_while_adding": walk,
    }
    rows = [
        (
            r["listing"],
            str(r["first_page_ms"]["p50"]),
            str(r["first_page_ms"]["p99"]),
            str(r["first_page_ms"]["max"]),
            str(r["deep_page"] or "-"),
            str(r["deep_page_ms"]["p50"]),
            str(r["deep_page_ms"]["p99"]),
            str(r["deep_page_ms"]["max"]),
        )
        for r in results
    ]
    rows.append(
        (
            "walk while adding",
            f"{walk['runs_read']} read",
            f"{walk['duplicates']} dup",
            f"{walk['missing']} missing",
            "ok" if walk["ok"] else "FAILED",
            f"{walk['added_at_the_top_read']}/{walk['added_at_the_top']} top",
            f"{walk['added_inside_read']}/{walk['added_inside']} inside",
        )
    )
    report(
        f"history: {total:,} runs, pages of {PAGE}, ms at the client",
        result,
        rows,
        ("listing", "p1 p50", "p1 p99", "p1 max", "page", "p50", "p99", "max"),
    )
    print_table(
        "plans (EXPLAIN ANALYZE of the store's statement)",
        [
            (
                r["listing"],
                "; ".join(dict.fromkeys(r["plan_first_page"]["nodes"])),
                str(r["plan_first_page"]["buffers"]),
                str(r.get("plan_deep_page", {}).get("buffers", "-")),
                str(r.get("plan_deep_page", {}).get("ms", "-")),
            )
            for r in results
        ],
        ("listing", "scans", "p1 buffers", "deep buffers", "deep ms"),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="the tenant's runs")
    parser.add_argument("--jobs", type=int, default=100, help="the tenant's jobs")
    parser.add_argument("--tenants", type=int, default=3, help="other tenants (runs/10 each)")
    parser.add_argument("--days", type=float, default=30.0, help="the span of due instants")
    parser.add_argument("--repeats", type=int, default=20, help="reads of each page timed")
    parser.add_argument("--walk-pages", type=int, default=WALK_PAGES)
    asyncio.run(main(parser.parse_args()))
