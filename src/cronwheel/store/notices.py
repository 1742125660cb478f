"""The notices the store sends, inside the transaction that makes a change: what they
carry, built and read here only. Notices wake loops up; they are never needed for
correctness (every loop that waits on one also polls the database now and then)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from cronwheel.domain.model import DueRun

__all__ = [
    "ANNOUNCE_HORIZON",
    "CHANNEL_CANCELS",
    "CHANNEL_GATES",
    "CHANNEL_KEYS_REVOKED",
    "CHANNEL_OPERATIONS",
    "CHANNEL_RUNS_NEW",
    "CHANNEL_RUNS_READY",
    "announce",
    "key_revoked",
    "parse_announcement",
    "parse_key_revoked",
    "parse_ready_notice",
    "parse_worker_notice",
    "ready_notices",
    "worker_notice",
]

# Channels the store notifies on, inside the transaction that makes the change:
CHANNEL_RUNS_NEW = "cw_runs_new"  # runs created or rescheduled to fire soon: "shard:epoch_ms:id"
# Runs became DISPATCHED: a ready notice per pool, "pool" when some are leasable now,
# and "pool<US>ms,ms,…" with the instants (epoch ms) the others may be leased from when
# they were dispatched ahead of them.
CHANNEL_RUNS_READY = "cw_runs_ready"
# An API key was revoked: "key id" (hex). Every API node drops it from its key cache.
CHANNEL_KEYS_REVOKED = "cw_keys_revoked"
# A bulk operation was accepted: "operation id". API nodes wake to claim it.
CHANNEL_OPERATIONS = "cw_operations"
# A cancel was requested of attempts a worker is running: "worker id" (hex). The API
# nodes answer that worker's cancels long-poll.
CHANNEL_CANCELS = "cw_cancels"
# The gates of nodes a worker reserved ahead of their upstream nodes opened: "worker id"
# (hex). The API nodes answer that worker's gates long-poll.
CHANNEL_GATES = "cw_gates"
_NOT_BEFORE = "\x1f"
_MAX_INSTANTS = 32  # per notice: a batch spread wider is woken at evenly spaced ones


def ready_notices(runs: Iterable[tuple[str, datetime]], at: datetime) -> list[str]:
    """The ready notices for runs ``(pool, fire_at)`` dispatched at ``at``."""
    now: set[str] = set()
    ahead: dict[str, set[int]] = {}
    for pool, fire_at in runs:
        if fire_at > at:
            ahead.setdefault(pool, set()).add(int(fire_at.timestamp() * 1000))
        else:
            now.add(pool)
    notices = sorted(now)
    for pool, instants in sorted(ahead.items()):
        ordered = sorted(instants)
        if len(ordered) > _MAX_INSTANTS:  # keep the last: no run waits past its wake
            step = len(ordered) / _MAX_INSTANTS
            ordered = [
                ordered[min(len(ordered) - 1, round((i + 1) * step) - 1)]
                for i in range(_MAX_INSTANTS)
            ]
        notices.append(f"{pool}{_NOT_BEFORE}{','.join(map(str, ordered))}")
    return notices


def parse_ready_notice(payload: str) -> tuple[str, list[datetime]]:
    """``(pool, instants)`` of a ready notice: the instants its runs may be leased from,
    none when they may be leased now."""
    pool, sep, tail = payload.rpartition(_NOT_BEFORE)
    parts = tail.split(",")
    if sep and all(p.isdigit() for p in parts):
        return pool, [datetime.fromtimestamp(int(p) / 1000, UTC) for p in parts]
    return payload, []


# Runs due this soon are announced to the schedulers at once (their window is shorter).
ANNOUNCE_HORIZON = timedelta(seconds=120)


def announce(run_id: uuid.UUID, shard: int, fire_at: datetime) -> str:
    """The payload of a CHANNEL_RUNS_NEW notification for one run."""
    return f"{shard}:{int(fire_at.timestamp() * 1000)}:{run_id.hex}"


def parse_announcement(payload: str) -> DueRun:
    """The run a CHANNEL_RUNS_NEW payload announces; ValueError when it is unreadable."""
    shard_s, ms_s, id_s = payload.split(":")
    return DueRun(
        id=uuid.UUID(hex=id_s),
        shard=int(shard_s),
        fire_at=datetime.fromtimestamp(int(ms_s) / 1000, UTC),
    )


def key_revoked(key_id: uuid.UUID) -> str:
    """The payload of a CHANNEL_KEYS_REVOKED notification."""
    return key_id.hex


def parse_key_revoked(payload: str) -> uuid.UUID:
    """The key a CHANNEL_KEYS_REVOKED payload names; ValueError when it is unreadable."""
    return uuid.UUID(hex=payload)


def worker_notice(worker_id: uuid.UUID) -> str:
    """The payload of a CHANNEL_CANCELS or CHANNEL_GATES notification."""
    return worker_id.hex


def parse_worker_notice(payload: str) -> uuid.UUID:
    """The worker a CHANNEL_CANCELS or CHANNEL_GATES payload names; ValueError when it
    is unreadable."""
    return uuid.UUID(hex=payload)
