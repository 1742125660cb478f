"""Handlers the benchmarks' workers run: they return at once."""

from __future__ import annotations

from typing import Any

from cronwheel.worker import task


@task("noop")
async def noop(ctx: Any, payload: dict[str, Any]) -> None:
    return None
