"""Scheduler nodes: shard leases, the due window, firing, lease expiry."""

from __future__ import annotations

from cronwheel.scheduler.node import Clock, SchedulerNode
from cronwheel.scheduler.window import DueWindow

__all__ = ["Clock", "DueWindow", "SchedulerNode"]
