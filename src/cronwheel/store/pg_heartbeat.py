"""PostgreSQL's heartbeat batch, in raw asyncpg on the transaction's own connection: one
statement extends every lease of the batch and records the progress reports riding on
it (the progress deadline is explained in ``store/sql/progress.py``). It implements
exactly the contract of the generic ``attempts_heartbeat_many``; the conformance suite
runs both.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cronwheel.domain.model import AttemptOutcome
from cronwheel.domain.states import RunState
from cronwheel.store.base import HeartbeatItem
from cronwheel.store.sql.progress import last_reports

__all__ = ["heartbeat_many"]

# $1 is the caller's now (NULL: the database clock); one row of $2… per (attempt, token).
# A beat without a report leaves the progress columns as they are; a report under no
# progress timeout leaves the deadline NULL (now plus a NULL interval).
_HEARTBEAT = """
WITH t AS (SELECT COALESCE($1::timestamptz, statement_timestamp()) AS now)
UPDATE attempts a
SET lease_expires_at = t.now + make_interval(secs => r.heartbeat_timeout), heartbeat_at = t.now,
    progress_at = CASE WHEN v.progress THEN t.now ELSE a.progress_at END,
    progress_details = CASE WHEN v.progress THEN v.details::jsonb ELSE a.progress_details END,
    progress_deadline = CASE WHEN v.progress
                             THEN t.now + make_interval(secs => r.progress_timeout)
                             ELSE a.progress_deadline END
FROM t, runs r,
     unnest($2::uuid[], $3::bigint[], $5::boolean[], $6::text[]) AS v(id, token, progress, details)
WHERE a.id = v.id AND a.fencing_token = v.token AND a.state = 'RUNNING' AND r.id = a.run_id
  AND ($4::uuid IS NULL OR a.tenant_id = $4)
RETURNING a.id, a.fencing_token, a.lease_expires_at, r.cancel_requested, r.state
"""


async def heartbeat_many(
    conn: Any,
    *,
    now: datetime | None,
    items: Sequence[HeartbeatItem],
    tenant_id: uuid.UUID | None,
) -> dict[tuple[uuid.UUID, int], AttemptOutcome]:
    # One row per (attempt, token), carrying its last report: an UPDATE … FROM applies
    # only one of several rows joining the same attempt, and not a chosen one.
    reports = {(i.attempt_id, i.fencing_token): i for i in last_reports(items)}
    beats = list(({(i.attempt_id, i.fencing_token): i for i in items} | reports).values())
    rows = await conn.fetch(
        _HEARTBEAT,
        now,
        [i.attempt_id for i in beats],
        [i.fencing_token for i in beats],
        tenant_id,
        [i.progress for i in beats],
        [None if i.details is None else json.dumps(i.details) for i in beats],
    )
    return {
        (r["id"], r["fencing_token"]): AttemptOutcome(
            r["id"],
            True,
            lease_expires_at=r["lease_expires_at"],
            cancel_requested=r["cancel_requested"],
            run_state=RunState(r["state"]),
        )
        for r in rows
    }
