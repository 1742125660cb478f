"""Handlers for the worker-fault tests. Each leaves marks — empty files named
``<run id>.<attempt>.<what>`` in the directory the payload's ``dir`` names — so the
test waits on what happened inside the worker instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from cronwheel.worker import TaskContext, task

_POLL = 0.02


def _mark(ctx: TaskContext, payload: dict[str, Any], what: str) -> None:
    (Path(payload["dir"]) / f"{ctx.run_id}.{ctx.attempt}.{what}").touch()


@task("fault.hold")
async def hold(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
    """The first attempt holds its run until the file ``<run id>.go`` appears; the
    others finish at once."""
    if ctx.attempt == 1:
        _mark(ctx, payload, "started")
        go = Path(payload["dir"]) / f"{ctx.run_id}.go"
        while not go.exists():  # noqa: ASYNC110 - a file another process writes
            await asyncio.sleep(_POLL)
    return {"attempt": ctx.attempt}


@task("fault.hang")
async def hang(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
    """The first attempt hangs far past any timeout and marks being cancelled; the
    others finish at once."""
    if ctx.attempt == 1:
        _mark(ctx, payload, "started")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _mark(ctx, payload, "cancelled")
            raise
    return {"attempt": ctx.attempt}


@task("fault.hang_sync")
def hang_sync(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
    """A sync handler cannot be cancelled, only asked to stop: the first attempt runs
    until it is, and marks that it stopped."""
    if ctx.attempt == 1:
        _mark(ctx, payload, "started")
        while not ctx.cancel_requested:
            time.sleep(_POLL)
        _mark(ctx, payload, "cancelled")
    return {"attempt": ctx.attempt}


@task("fault.fail")
async def always_fail(ctx: TaskContext, payload: dict[str, Any]) -> None:
    raise RuntimeError(f"attempt {ctx.attempt} fails, as every attempt does")
