"""How long the dashboard's pages take for a tenant with a million runs (PostgreSQL).

Builds the volume of ``tests/store/test_tenant_plans.py`` — a tenant with N runs (with
their attempts and events) over 10,000 jobs, beside one with 100 — then signs in to
the real app with the big tenant's key and opens each page once (cold) and then R times over HTTP
(in process, no network), reporting the first answer's time, the median and the slowest
of the R in milliseconds.

    python bench/ui_pages.py --runs 1000000 --repeat 20

Prints JSON on stdout and a table on stderr. Creates and drops its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
from asgi_lifespan import LifespanManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cronwheel.api import create_app, generate_key
from cronwheel.settings import Settings
from cronwheel.store import RunFilter, create_store
from pg_server import pg_admin, pg_url
from store.helpers import T0
from store.tenant_volume import two_tenants

_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


async def _pages(url: str, tenant_id: uuid.UUID, repeat: int) -> dict[str, dict[str, float]]:
    store = create_store(url)
    await store.open()
    key, key_hash, prefix = generate_key()
    await store.api_keys_create(tenant_id, role="operator", key_hash=key_hash, prefix=prefix)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp),
            admin_key="bench-admin-key",
            rate_limit=0,
            anonymous_rate_limit=0,
            log_store="database",
        )
        app = create_app(settings, store)
        results: dict[str, dict[str, float]] = {}
        try:
            async with (
                LifespanManager(app),
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://bench"
                ) as client,
            ):
                form = await client.get("/ui/sign-in")
                csrf = _CSRF.search(form.text)
                assert csrf is not None
                signed = await client.post(
                    "/ui/sign-in", data={"api_key": key, "csrf": csrf.group(1)}
                )
                assert signed.status_code == 303, signed.text
                # A finished run (the newest due are scheduled ones, with no attempt).
                done = RunFilter(states=["SUCCESS"])
                [failed] = (await store.runs_list(tenant_id, filter=done, limit=1)).items
                job_id = failed.job_id
                dead = (await store.runs_list(tenant_id, limit=1)).items[0]
                since = (T0 - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
                until = T0.strftime("%Y-%m-%dT%H:%M")
                pages = {
                    "overview": "/ui/overview",
                    "jobs": "/ui/jobs",
                    "jobs, name prefix": "/ui/jobs?name=job-99",
                    "jobs, state paused": "/ui/jobs?state=paused",
                    "job": f"/ui/jobs/{job_id}",
                    "runs": "/ui/runs",
                    "runs, FAILED": "/ui/runs?state=FAILED",
                    "runs, one job": f"/ui/runs?job={job_id}",
                    "runs, last hour before T0": f"/ui/runs?since={since}&until={until}",
                    "run": f"/ui/runs/{failed.id}",
                    "run log (json)": f"/ui/runs/{dead.id}/logs.json",
                    "dead letters": "/ui/dead-letters",
                    "workers and pools": "/ui/workers",
                }
                for name, path in pages.items():
                    started = time.perf_counter()
                    first = await client.get(path)  # cold: the database's cache too
                    first_ms = (time.perf_counter() - started) * 1000
                    assert first.status_code == 200, (path, first.status_code)
                    times = []
                    for _ in range(repeat):
                        started = time.perf_counter()
                        r = await client.get(path)
                        times.append((time.perf_counter() - started) * 1000)
                        assert r.status_code == 200, (path, r.status_code, r.text[:300])
                    results[name] = {
                        "first_ms": round(first_ms, 1),
                        "median_ms": round(statistics.median(times), 1),
                        "max_ms": round(max(times), 1),
                    }
        finally:
            await store.close()
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    name = f"cw_ui_bench_{uuid.uuid4().hex[:8]}"
    await pg_admin(f'CREATE DATABASE "{name}"')
    try:
        url = pg_url(name)
        started = time.monotonic()
        tenant_id, _small = await two_tenants(url, args.runs)
        print(f"built {args.runs:,} runs in {time.monotonic() - started:.0f} s", file=sys.stderr)
        results = await _pages(url, tenant_id, args.repeat)
    finally:
        await pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"{'page':32} {'first ms':>9} {'median ms':>10} {'max ms':>8}", file=sys.stderr)
    for page, r in results.items():
        print(
            f"{page:32} {r['first_ms']:>9} {r['median_ms']:>10} {r['max_ms']:>8}", file=sys.stderr
        )
    print(json.dumps({"runs": args.runs, "repeat": args.repeat, "pages": results}))


if __name__ == "__main__":
    asyncio.run(main())
