"""Workers: the Python SDK (:class:`Worker`) and the HTTP worker protocol it speaks.

Handlers are registered on a worker (``@worker.task("name")``) or on the global
registry (``@cronwheel.worker.task("name")``), which ``cronwheel worker --import``
attaches to the worker it builds.
"""

from __future__ import annotations

from cronwheel.worker.logship import LogShipConfig
from cronwheel.worker.protocol import Lease, WorkerProtocol
from cronwheel.worker.sdk import Worker, webhook_worker
from cronwheel.worker.tasks import (
    Handler,
    NonRetryableError,
    TaskContext,
    TaskRegistry,
    registry,
    task,
)

__all__ = [
    "Handler",
    "Lease",
    "LogShipConfig",
    "NonRetryableError",
    "TaskContext",
    "TaskRegistry",
    "Worker",
    "WorkerProtocol",
    "registry",
    "task",
    "webhook_worker",
]
