"""Shards: a run's shard is a stable hash of its tenant and job, so one tenant's volume
spreads over every shard while one job's runs all live in one."""

from __future__ import annotations

import hashlib
import uuid

__all__ = ["NUM_SHARDS", "shard_of"]

NUM_SHARDS = 256


def shard_of(tenant_id: uuid.UUID, job_id: uuid.UUID) -> int:
    digest = hashlib.blake2b(tenant_id.bytes + job_id.bytes, digest_size=4).digest()
    return int.from_bytes(digest, "big") % NUM_SHARDS
