"""Handlers for the end-to-end tests' worker processes."""

from __future__ import annotations

from typing import Any

from cronwheel.worker import task


@task("e2e.echo")
async def echo(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    return {"echo": payload.get("n")}
