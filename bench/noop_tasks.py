"""Handlers the benchmarks' workers run: ``noop`` returns at once, ``sleep`` waits
``payload["seconds"]`` (0.05 by default) without holding the CPU.

Each notes the instant of its first statement (``time.time()``) with the run's id, one
line per execution, in a file per worker process under the folder named by
``CRONWHEEL_BENCH_HANDLER_LOG`` (the harness sets it; ``handler_starts`` reads it): the
start lateness a handler sees, and whether any run was executed twice."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, TextIO

from cronwheel.worker import task

_FOLDER = os.environ.get("CRONWHEEL_BENCH_HANDLER_LOG")
_notes: TextIO | None = None


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
