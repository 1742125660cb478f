"""The event loop every long-running cronwheel process runs on: uvloop where it is
installed (it comes with uvicorn's standard extras), the standard loop otherwise. Its
sockets and callbacks cost a fraction of the standard loop's per request and per
statement, and a worker, an API node and a scheduler spend most of their time there."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["loop_factory", "run"]

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed; None (the standard loop) otherwise."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on :func:`loop_factory`'s loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
