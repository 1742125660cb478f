"""Working a workflow run's nodes with the real worker SDK, for the client and CLI tests
of workflows: the ETL handlers of ``examples/pipeline.yaml``, and a worker that drains
the leasable node runs again and again until the workflow run is over."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from cronwheel.testing import wait_until
from cronwheel.worker import NonRetryableError, TaskContext, Worker

__all__ = ["OVER", "EtlTasks", "work_until_over"]

OVER = frozenset({"SUCCESS", "FAILED", "CANCELLED"})


class EtlTasks:
    """extract -> transform (twice) -> load, each answering what it saw upstream. A
    part named in ``failing`` fails its transform at once (no retry) until removed."""

    def __init__(self, *failing: str) -> None:
        self.failing = set(failing)
        self.payloads: dict[str, list[dict[str, Any]]] = {}

    def _saw(self, task: str, payload: dict[str, Any]) -> None:
        self.payloads.setdefault(task, []).append(payload)

    def extract(self, ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        self._saw("extract", payload)
        return {"rows": 3, "source": payload.get("source")}

    def transform(self, ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        self._saw("transform", payload)
        if payload["part"] in self.failing:
            raise NonRetryableError(f"part {payload['part']} is broken")
        return {"part": payload["part"], "rows": payload["upstream"]["extract"]["rows"]}

    def load(self, ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        self._saw("load", payload)
        upstream = payload["upstream"]
        return {"loaded": sorted(upstream), "rows": sum(u["rows"] for u in upstream.values())}

    def worker(self, url: str, key: str) -> Worker:
        worker = Worker(url, api_key=key, lease_wait=0.5)
        worker.task("etl.extract")(self.extract)
        worker.task("etl.transform")(self.transform)
        worker.task("etl.load")(self.load)
        return worker


def work_until_over(
    worker: Worker, read: Callable[[], dict[str, Any]], *, timeout: float = 60.0
) -> dict[str, Any]:
    """Drain ``worker`` until the workflow run ``read`` answers is over; answers it.
    Nodes become ready as their upstream ones end, so one drain may not see them all."""
    seen: list[dict[str, Any]] = []

    def over() -> dict[str, Any] | None:
        asyncio.run(worker.run_async(drain=True))
        seen.append(read())
        return seen[-1] if seen[-1]["state"] in OVER else None

    def state() -> str:
        if not seen:
            return "the workflow run (never read)"
        nodes = {n["node"]: n["state"] for n in seen[-1].get("nodes", [])}
        return f"the workflow run over; it is {seen[-1]['state']} with nodes {nodes}"

    result: dict[str, Any] = wait_until(over, timeout, what=state, interval=0.05)
    return result
