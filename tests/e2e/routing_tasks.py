"""A second set of handlers for the end-to-end routing test: a worker importing this
module runs ``e2e.shout`` and nothing else."""

from __future__ import annotations

from typing import Any

from cronwheel.worker import task


@task("e2e.shout")
async def shout(ctx: Any, payload: dict[str, Any]) -> str:
    return str(payload.get("word", "")).upper()
