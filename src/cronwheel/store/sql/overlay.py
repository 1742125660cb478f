"""Overrides applied to runs: the steps every change that reaches runs shares — an
override made or removed (``overrides.py``), a job's template edited (``edits.py``), a
run made by a trigger or a backfill (``triggers.py``).

A run some override reached keeps its *base* and the ids of those overrides in the
merge order (``runs.overrides``), and its own columns hold the result
(``domain/overrides.applied``), so nothing is applied when a run is leased. A job with
``future`` overrides keeps them, applied to its template, in ``jobs.overrides``: the
scheduler's next-occurrence statement copies the fields from there (no Python, no round
trip), and the other paths that make runs through :func:`overlaid_rows`.

Writing a run's fields voids its reservation: the worker that holds it was handed the
old payload, so its start is refused and the run goes to whoever leases it next.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.errors import ValidationError
from cronwheel.domain.model import Job
from cronwheel.domain.new_job import check_json_size
from cronwheel.domain.overrides import (
    FIELDS,
    Override,
    OverrideScope,
    RunFields,
    applied,
    merge_order,
    run_overlay,
)
from cronwheel.domain.states import RunState
from cronwheel.domain.template import RunTemplate
from cronwheel.store.driver import Driver
from cronwheel.store.schema import NO_RESERVATION, jobs, overrides, runs
from cronwheel.store.sql.statements import update_each

__all__ = [
    "UNSTARTED",
    "Reached",
    "check_override_timeouts",
    "future_overrides",
    "job_overlaid",
    "job_overlay_written",
    "overlaid_rows",
    "override_from",
    "overrides_by_id",
    "runs_overlaid",
    "template_fields",
]

# A run an override can still change: made, not leased, never tried.
UNSTARTED = sa.and_(
    runs.c.state.in_((RunState.SCHEDULED.value, RunState.DISPATCHED.value)),
    runs.c.attempt == 0,
)

_RUN_COLUMNS = (
    runs.c.id,
    runs.c.state,
    runs.c.pool,
    runs.c.fire_at,
    runs.c.payload,
    runs.c.timeout,
    runs.c.priority,
    runs.c.reserved_token,
    runs.c.overrides,
)


def override_from(row: Any, status: str = "active") -> Override:
    return Override(
        id=row.id,
        tenant_id=row.tenant_id,
        job_id=row.job_id,
        run_id=row.run_id,
        scope=OverrideScope(row.scope),
        payload=row.payload,
        timeout=row.timeout,
        priority=row.priority,
        pool=row.pool,
        reason=row.reason,
        created_by=row.created_by,
        created_at=row.created_at,
        removed_at=row.removed_at,
        removed_by=row.removed_by,
        status=status,
    )


def template_fields(template: RunTemplate) -> RunFields:
    return RunFields(
        payload=template.payload,
        timeout=template.timeout,
        priority=template.priority,
        pool=template.pool,
    )


async def overrides_by_id(
    conn: AsyncConnection, driver: Driver, tenant_id: uuid.UUID, ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, Override]:
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = await conn.execute(
        sa.select(overrides).where(
            overrides.c.tenant_id == tenant_id, driver.id_in(overrides.c.id, wanted)
        )
    )
    return {r.id: override_from(r) for r in rows}


async def future_overrides(conn: AsyncConnection, job: Job) -> list[Override]:
    """The job's ``future`` overrides that are on, in the merge order."""
    rows = await conn.execute(
        sa.select(overrides).where(
            overrides.c.tenant_id == job.tenant_id,
            overrides.c.job_id == job.id,
            overrides.c.scope == OverrideScope.FUTURE.value,
            overrides.c.removed_at.is_(None),
        )
    )
    return merge_order(override_from(r) for r in rows)


async def check_override_timeouts(conn: AsyncConnection, job: Job) -> None:
    """Refuse ``job``'s template (as an edit makes it) when its ``progress_timeout``
    exceeds the ``timeout`` of an override still to reach a run: a ``future`` one, or
    one bound to a run that has not started. An override is refused the other way round
    when it is made (``timeout`` below the runs' ``progress_timeout``)."""
    progress = job.template.progress_timeout
    if progress is None:
        return
    unstarted = (
        sa.select(runs.c.id)
        .where(
            runs.c.tenant_id == overrides.c.tenant_id, runs.c.id == overrides.c.run_id, UNSTARTED
        )
        .exists()
    )
    row = (
        await conn.execute(
            sa.select(overrides.c.id, overrides.c.timeout)
            .where(
                overrides.c.tenant_id == job.tenant_id,
                overrides.c.job_id == job.id,
                overrides.c.removed_at.is_(None),
                overrides.c.timeout < progress,
                sa.or_(overrides.c.scope == "future", unstarted),
            )
            .order_by(overrides.c.id)
            .limit(1)
        )
    ).first()
    if row is not None:
        raise ValidationError(
            f"progress_timeout: must be at most the timeout of override {row.id} "
            f"({row.timeout:g} s); remove the override or lower progress_timeout",
            field="progress_timeout",
        )


async def job_overlay_written(
    conn: AsyncConnection, job: Job, *, max_payload_bytes: int | None = None
) -> list[Override]:
    """``jobs.overrides`` as the job's ``future`` overrides and its template make it
    now (None for none); answers those overrides. ``max_payload_bytes``: a payload they
    make larger than the template's is refused (413), as the next runs would carry it."""
    futures = await future_overrides(conn, job)
    overlay = None
    if futures:
        base = template_fields(job.template)
        made = applied(base, futures)
        if max_payload_bytes is not None and made.payload != base.payload:
            check_json_size(made.payload, limit=max_payload_bytes, field="payload")
        overlay = {
            **(run_overlay(base, futures) or {}),
            "fields": made.to_json(),
        }
    if overlay != job.overlay:
        await conn.execute(
            jobs.update()
            .where(jobs.c.tenant_id == job.tenant_id, jobs.c.id == job.id)
            .values(overrides=overlay)
        )
    return futures


def job_overlaid(row: dict[str, Any], overlay: dict[str, Any] | None) -> dict[str, Any]:
    """A new run's row made from its job's template, with the job's ``future``
    overrides (``jobs.overrides``) applied, as the PostgreSQL next-occurrence statement
    applies them."""
    if overlay:
        row.update(overlay["fields"], overrides={"ids": overlay["ids"], "base": overlay["base"]})
    return row


def overlaid_rows(rows: Sequence[dict[str, Any]], futures: Sequence[Override]) -> None:
    """New runs' rows (``new_run_row``) with the job's ``future`` overrides applied."""
    if not futures:
        return
    for row in rows:
        base = RunFields.from_json(row)
        row.update(applied(base, futures).to_json(), overrides=run_overlay(base, futures))


class Reached:
    """The runs an overlay change wrote: their ids, and the ready notices owed (a
    dispatched run moved to another pool, or whose reservation was voided)."""

    def __init__(self) -> None:
        self.ids: list[uuid.UUID] = []
        self.ready: list[tuple[str, datetime]] = []


async def runs_overlaid(
    conn: AsyncConnection,
    driver: Driver,
    tenant_id: uuid.UUID,
    where: sa.ColumnElement[bool],
    *,
    add: Sequence[Override] = (),
    remove: uuid.UUID | None = None,
    rebase: RunFields | None = None,
    max_payload_bytes: int | None = None,
) -> Reached:
    """Apply overrides again to the unstarted runs ``where`` selects (the caller locked
    the job's live runs, then the job): with ``add`` among theirs, without ``remove``,
    and on ``rebase`` as their base (a job's edited template) — each run's fields
    written from its base and its overrides in the merge order. A run left with no
    override gets its base back. ``max_payload_bytes``: a payload the overrides make
    larger is refused (413)."""
    # Locked here too, in id order, though the caller holds the job and every live run
    # of it (``_lock_jobs_with_runs``): unlocked, a run could be fired, leased and
    # started before it is written, and its worker would hold a payload the run no
    # longer records; locked, one that started meanwhile is read as started and left
    # alone.
    rows = list(
        await conn.execute(
            sa.select(*_RUN_COLUMNS)
            .where(runs.c.tenant_id == tenant_id, where, UNSTARTED)
            .order_by(runs.c.id)
            .with_for_update()
        )
    )
    reached = Reached()
    if not rows:
        return reached
    held: dict[uuid.UUID, list[uuid.UUID]] = {}
    for r in rows:
        ids = [uuid.UUID(i) for i in (r.overrides or {}).get("ids", [])]
        held[r.id] = [i for i in ids if i != remove]
    known = await overrides_by_id(
        conn, driver, tenant_id, {i for ids in held.values() for i in ids}
    )
    known.update({o.id: o for o in add})
    updates: list[dict[str, Any]] = []
    for r in rows:
        base = rebase or (
            RunFields.from_json(r.overrides["base"])
            if r.overrides
            else RunFields(payload=r.payload, timeout=r.timeout, priority=r.priority, pool=r.pool)
        )
        mine = [known[i] for i in held[r.id] if i in known]
        mine += [o for o in add if o.id not in held[r.id]]
        result = applied(base, mine)
        if max_payload_bytes is not None and result.payload != base.payload:
            check_json_size(result.payload, limit=max_payload_bytes, field="payload")
        values = result.to_json()
        current = {name: getattr(r, name) for name in FIELDS}
        overlay = run_overlay(base, mine)
        if values == current and overlay == r.overrides:
            continue
        updates.append({"id": r.id, **values, "overrides": overlay, **NO_RESERVATION})
        reached.ids.append(r.id)
        if r.state == RunState.DISPATCHED.value:
            reached.ready.append((result.pool, r.fire_at))
    await update_each(conn, runs, updates)
    return reached
