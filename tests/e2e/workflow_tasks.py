"""Handlers for the workflow end-to-end tests' worker processes. Each node's payload
names the node (``name``) and the folder the test watches (``dir``).

``wf.gate`` notes when an execution begins and when it ends (``begin`` / ``end``, the
node, the attempt, the run, the worker's process id and ``time.time()``), one line each
in ``<dir>/executions.tsv``, and marks ``<node>.<attempt>.started``; between the two it
holds the node until the file ``<node>.go`` appears, so that the test decides when each
node finishes instead of sleeping. Every node returns what it saw of its upstream
nodes' results."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from cronwheel.worker import TaskContext, task

_POLL = 0.02
EXECUTIONS = "executions.tsv"  # test_workflow_e2e.py reads it (and says so)


def _note(folder: Path, what: str, ctx: TaskContext, name: str) -> None:
    line = f"{what}\t{name}\t{ctx.attempt}\t{ctx.run_id}\t{os.getpid()}\t{time.time()!r}\n"
    # One write() in append mode: lines from several workers never mix.
    fd = os.open(folder / EXECUTIONS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _answer(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "node": payload["name"],
        "attempt": ctx.attempt,
        "upstream": sorted(payload.get("upstream", {})),
    }


@task("wf.echo")
async def echo(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
    return _answer(ctx, payload)


@task("wf.gate")
async def gate(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
    folder, name = Path(payload["dir"]), payload["name"]
    _note(folder, "begin", ctx, name)
    (folder / f"{name}.{ctx.attempt}.started").touch()
    go = folder / f"{name}.go"
    while not go.exists():  # noqa: ASYNC110 - a file the test writes
        await asyncio.sleep(_POLL)
    _note(folder, "end", ctx, name)
    return _answer(ctx, payload)
