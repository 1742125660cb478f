"""The SQLite driver's statements for the scheduler — fire a batch, create the next
occurrences, append events, renew shard leases — in SQLAlchemy Core: a few statements
per batch, never one per run (the worker side is in ``sqlite_leasing.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.model import FiredRun
from cronwheel.domain.states import FIRE, RunState
from cronwheel.domain.template import RunTemplate
from cronwheel.store.driver import (
    CreatedRun,
    Driver,
    FireCandidate,
    PlannedRun,
)
from cronwheel.store.notices import CHANNEL_RUNS_READY, ready_notices
from cronwheel.store.rows import event_row, lateness_reason, new_run_row
from cronwheel.store.schema import (
    NO_RESERVATION,
    events,
    jobs,
    runs,
    scheduler_nodes,
    shard_leases,
)
from cronwheel.store.sql.overlay import job_overlaid
from cronwheel.store.sql.statements import (
    insert_ignoring,
    may,
    shard_held,
    shard_leases_take,
)
from cronwheel.store.values import LeaseRenewal
from cronwheel.timing.spread import spread_instant

__all__ = ["CoreFiring"]


class CoreFiring(Driver):
    """The scheduler's statements of a driver that speaks SQLAlchemy Core only."""

    async def events_insert(self, conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            await conn.execute(events.insert(), list(rows))

    # -- firing ------------------------------------------------------------------------

    async def runs_fire(
        self,
        conn: AsyncConnection,
        *,
        run_ids: Sequence[uuid.UUID],
        node_id: str,
        at: datetime | None,
        lead: float,
        epochs: Mapping[int, int] | None,
    ) -> list[FiredRun]:
        at = await self.instant(conn, at)
        # The epoch fence: only the live owner of a run's shard may fire it. A node that
        # lost its lease (paused, partitioned) matches nothing here.
        held = shard_held(runs.c.shard, node_id=node_id, at=at, epochs=_dict(epochs))
        rows = (
            await conn.execute(
                runs.update()
                .where(
                    self.id_in(runs.c.id, list(run_ids)),
                    may(FIRE),
                    runs.c.fire_at <= at + timedelta(seconds=lead),
                    sa.or_(runs.c.origin != "schedule", runs.c.attempt > 0),
                    held,
                )
                .values(state=RunState.DISPATCHED.value, dispatched_at=at, **NO_RESERVATION)
                .returning(
                    runs.c.id,
                    runs.c.tenant_id,
                    runs.c.job_id,
                    runs.c.pool,
                    runs.c.fire_at,
                    runs.c.dispatched_at,
                    runs.c.priority,
                )
            )
        ).all()
        if rows:
            await self.events_insert(
                conn,
                [
                    event_row(
                        at=at,
                        kind="run.transition",
                        tenant_id=r.tenant_id,
                        job_id=r.job_id,
                        run_id=r.id,
                        from_state=FIRE.source.value,
                        to_state=RunState.DISPATCHED.value,
                        actor=node_id,
                        reason=lateness_reason(r.fire_at, at),
                    )
                    for r in rows
                ],
            )
            await self.notify(
                conn, CHANNEL_RUNS_READY, ready_notices(((r.pool, r.fire_at) for r in rows), at)
            )
        return [
            FiredRun(
                id=r.id,
                tenant_id=r.tenant_id,
                pool=r.pool,
                fire_at=r.fire_at,
                dispatched_at=r.dispatched_at,
                priority=r.priority,
            )
            for r in rows
        ]

    async def runs_fire_candidates(
        self,
        conn: AsyncConnection,
        *,
        run_ids: Sequence[uuid.UUID],
        node_id: str,
        at: datetime,
        lead: float,
        epochs: Mapping[int, int] | None,
    ) -> list[FireCandidate]:
        rows = await conn.execute(
            sa.select(
                runs.c.id,
                runs.c.tenant_id,
                runs.c.job_id,
                runs.c.job_name,
                runs.c.shard,
                runs.c.due_at,
                runs.c.fire_at,
                runs.c.pool,
                runs.c.priority,
                jobs.c.state.label("job_state"),
                jobs.c.schedule,
                sa.func.coalesce(sa.func.json_extract(jobs.c.template, "$.spread"), 0.0).label(
                    "spread"
                ),
            )
            .join(jobs, jobs.c.id == runs.c.job_id)
            .where(
                self.id_in(runs.c.id, list(run_ids)),
                may(FIRE),  # to fire, or to skip (SKIP leaves the same states)
                runs.c.origin == "schedule",
                runs.c.attempt == 0,
                runs.c.fire_at <= at + timedelta(seconds=lead),
                shard_held(runs.c.shard, node_id=node_id, at=at, epochs=_dict(epochs)),
            )
            .with_for_update(of=runs, skip_locked=True)
        )
        return [FireCandidate(**r._mapping) for r in rows]

    async def runs_insert_planned(
        self,
        conn: AsyncConnection,
        *,
        planned: Sequence[PlannedRun],
        sources: Mapping[uuid.UUID, FireCandidate],
        at: datetime,
        node_id: str,
    ) -> list[CreatedRun]:
        if not planned:
            return []
        job_ids = list({sources[p.source].job_id for p in planned})
        made = {
            j.id: j
            for j in await conn.execute(
                sa.select(jobs.c.id, jobs.c.template, jobs.c.overrides).where(
                    self.id_in(jobs.c.id, job_ids)
                )
            )
        }
        templates = {i: RunTemplate.from_json(j.template) for i, j in made.items()}
        rows: list[dict[str, Any]] = []
        for p in planned:
            run = sources[p.source]
            state = RunState(p.state)
            rows.append(
                job_overlaid(
                    new_run_row(
                        run_id=p.id,
                        tenant_id=run.tenant_id,
                        job_id=run.job_id,
                        name=run.job_name,
                        template=templates[run.job_id],
                        due_at=p.due_at,
                        due_local=p.due_local,
                        shard=run.shard,
                        at=at,
                        origin=p.origin,
                        state=state,
                        fire_at=spread_instant(run.job_id, p.due_at, templates[run.job_id].spread),
                    ),
                    made[run.job_id].overrides,
                )
                | {
                    "reason": p.reason,
                    "dispatched_at": at if state is RunState.DISPATCHED else None,
                    "finished_at": at if state is RunState.SKIPPED else None,
                }
            )
        created = [
            CreatedRun(**r._mapping)
            for r in await insert_ignoring(
                conn,
                self,
                runs,
                rows,
                (
                    runs.c.id,
                    runs.c.tenant_id,
                    runs.c.job_id,
                    runs.c.state,
                    runs.c.reason,
                    runs.c.shard,
                    runs.c.fire_at,
                    runs.c.pool,
                ),
            )
        ]
        events_: list[dict[str, Any]] = []
        for r in created:
            events_.append(
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=r.tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    to_state=RunState.SCHEDULED.value,
                    actor=node_id,
                    reason="next occurrence",
                )
            )
            if r.state != RunState.SCHEDULED.value:
                events_.append(
                    event_row(
                        at=at,
                        kind="run.transition",
                        tenant_id=r.tenant_id,
                        job_id=r.job_id,
                        run_id=r.id,
                        from_state=RunState.SCHEDULED.value,
                        to_state=r.state,
                        actor=node_id,
                        reason=r.reason,
                    )
                )
        await self.events_insert(conn, events_)
        return created

    # -- shard leases ------------------------------------------------------------------

    async def shard_leases_renew(
        self,
        conn: AsyncConnection,
        *,
        node_id: str,
        ttl: float,
        shards: int,
        now: datetime | None,
    ) -> LeaseRenewal:
        at = await self.instant(conn, now)
        await conn.execute(
            scheduler_nodes.delete().where(
                scheduler_nodes.c.node_id != node_id,
                scheduler_nodes.c.heartbeat_at < at - timedelta(seconds=ttl),
            )
        )
        updated = await conn.execute(
            scheduler_nodes.update()
            .where(scheduler_nodes.c.node_id == node_id)
            .values(heartbeat_at=at)
        )
        if updated.rowcount == 0:
            await conn.execute(
                self.insert_ignore(
                    scheduler_nodes, [{"node_id": node_id, "started_at": at, "heartbeat_at": at}]
                )
            )
        live = int(
            (
                await conn.execute(sa.select(sa.func.count()).select_from(scheduler_nodes))
            ).scalar_one()
        )
        share = -(-shards // max(1, live))
        held = await shard_leases_take(
            conn, self, node_id=node_id, shards=range(shards), ttl=ttl, limit=share, at=at
        )
        others: datetime | None = (
            await conn.execute(
                sa.select(sa.func.min(shard_leases.c.expires_at)).where(
                    shard_leases.c.owner.is_not(None),
                    shard_leases.c.owner != node_id,
                    shard_leases.c.expires_at > at,
                )
            )
        ).scalar()
        return LeaseRenewal(live=live, share=share, held=held, others_expire_at=others)


def _dict(epochs: Mapping[int, int] | None) -> dict[int, int] | None:
    return None if epochs is None else dict(epochs)
