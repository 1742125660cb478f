"""Handlers the benchmarks' workers run: ``noop`` returns at once, ``sleep`` waits
``payload["seconds"]`` (0.05 by default) without holding the CPU, ``hold`` waits until
it is cancelled (at most ``payload["seconds"]``, 600 by default).

Each notes the instant of its first statement (``time.time()``) with the run's id, one
line per execution, in a file per worker process under the folder named by
``CRONWHEEL_BENCH_HANDLER_LOG`` (the harness sets it; ``handler_starts`` reads it): the
start lateness a handler sees, and whether any run was executed twice. ``hold`` also
notes the instant it learns of its cancel, in a file of its own per process
(``handler_cancels`` reads it)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, TextIO

from cronwheel.worker import task

_FOLDER = os.environ.get("CRONWHEEL_BENCH_HANDLER_LOG")
_notes: TextIO | None = None
_cancels: TextIO | None = None


def _note(ctx: Any, at: float) -> None:
    global _notes
    if _FOLDER is None:
        return
    if _notes is None:
        # Line-buffered: each note reaches the file as one write() before the handler
        # returns, so it is there once the run shows as finished.
        _notes = open(Path(_FOLDER) / f"worker-{os.getpid()}.tsv", "a", buffering=1)  # noqa: SIM115
    _notes.write(f"{ctx.run_id}\t{ctx.attempt}\t{at!r}\n")


@task("noop")
async def noop(ctx: Any, payload: dict[str, Any]) -> None:
    at = time.time()
    _note(ctx, at)


@task("sleep")
async def sleep(ctx: Any, payload: dict[str, Any]) -> None:
    at = time.time()
    _note(ctx, at)
    await asyncio.sleep(float(payload.get("seconds", 0.05)))


@task("hold")
async def hold(ctx: Any, payload: dict[str, Any]) -> None:
    at = time.time()
    _note(ctx, at)
    try:
        await asyncio.sleep(float(payload.get("seconds", 600)))
    except asyncio.CancelledError:
        # The worker cancels an async handler when it learns of the run's cancel: this
        # is the instant the handler sees it.
        _note_cancel(ctx, time.time())
        raise


def _note_cancel(ctx: Any, at: float) -> None:
    global _cancels
    if _FOLDER is None:
        return
    if _cancels is None:
        _cancels = open(Path(_FOLDER) / f"cancels-{os.getpid()}.txt", "a", buffering=1)  # noqa: SIM115
    _cancels.write(f"{ctx.run_id}\t{ctx.attempt}\t{at!r}\t{int(ctx.cancel_requested)}\n")
