"""The scheduler cluster for real: ``cronwheel api`` and separate ``cronwheel scheduler``
processes on PostgreSQL, with a short shard lease so that takeover is quick. While a
stream of one-off runs falls due, nodes join (rebalancing), are frozen past their lease
(``SIGSTOP``) and thawed, killed (``kill -9``) mid-spike, replaced and stopped
gracefully. The verdict comes from the database: every run dispatched exactly once (one
SCHEDULED -> DISPATCHED event per run), none lost, lateness explained, and failover
bounded by the lease TTL. No worker runs: a dispatched run stays DISPATCHED."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest

from cronwheel.domain.sharding import NUM_SHARDS
from cronwheel.domain.states import illegal_transitions
from cronwheel.testing import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

TTL = 2.0  # the shard lease TTL of every node: a lost node's shards move within ~TTL
# Runs fire at their instant (no dispatch lead for bursts): "never early" holds strictly.
# No worker runs here: what is tested is dispatch, so a burst is not held back for want
# of capacity (the release of bursts as pools take them: tests/integration/
# test_scheduler.py and docs/admission.md).
NODE_ENV = {
    "CRONWHEEL_SHARD_LEASE_TTL": str(TTL),
    "CRONWHEEL_DISPATCH_LEAD": "0",
    "CRONWHEEL_DISPATCH_BUFFER": "1000000",
}
# On top of a takeover bound: a loaded 2-core machine, other tests running.
SLACK = 8.0
LATE = 1.0  # dispatched later than this after its due time: the event says why
HISTORY = [(None, "SCHEDULED"), ("SCHEDULED", "DISPATCHED")]


# -- the database, read directly ------------------------------------------------------


@dataclass(frozen=True)
class Dispatch:
    """A run with one of its SCHEDULED -> DISPATCHED events (event fields None if none)."""

    run_id: uuid.UUID
    job_id: uuid.UUID
    shard: int
    state: str
    fire_at: datetime
    dispatched_at: datetime | None
    event_id: int | None
    at: datetime | None
    actor: str | None
    reason: str | None

    @property
    def late(self) -> float:
        assert self.at is not None
        return (self.at - self.fire_at).total_seconds()


class Db:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    @classmethod
    async def connect(cls, url: str) -> Db:
        return cls(await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://")))

    async def close(self) -> None:
        await self.conn.close()

    async def now(self) -> datetime:
        value: datetime = await self.conn.fetchval("SELECT clock_timestamp()")
        return value

    async def held(self) -> dict[str, set[int]]:
        """Unexpired shard leases by owner."""
        rows = await self.conn.fetch(
            "SELECT owner, shard FROM shard_leases"
            " WHERE owner IS NOT NULL AND expires_at > clock_timestamp()"
        )
        owners: dict[str, set[int]] = defaultdict(set)
        for r in rows:
            owners[r["owner"]].add(r["shard"])
        return owners

    async def owned_by(self, node: str) -> int:
        """Lease rows naming ``node`` as owner, expired or not."""
        count: int = await self.conn.fetchval(
            "SELECT count(*) FROM shard_leases WHERE owner = $1", node
        )
        return count

    async def mark(self) -> int:
        """An event id: every event inserted after this call has a greater one."""
        value: int = await self.conn.fetchval(
            "SELECT nextval(pg_get_serial_sequence('events', 'id'))"
        )
        return value

    async def scheduled(self, *, due_by: datetime | None = None) -> int:
        """Runs still SCHEDULED (due by ``due_by``, if given)."""
        count: int = await self.conn.fetchval(
            "SELECT count(*) FROM runs WHERE state = 'SCHEDULED'"
            " AND ($1::timestamptz IS NULL OR fire_at <= $1)",
            due_by,
        )
        return count

    async def sessions(self) -> list[dict[str, object]]:
        """The other sessions on this database that are not idle: what each is doing,
        which transaction it holds open, what it waits for and who blocks it."""
        rows = await self.conn.fetch(
            r"""
            SELECT pid, state, backend_xid::text AS xid, wait_event_type, wait_event,
                   pg_blocking_pids(pid) AS blocked_by,
                   round(extract(epoch FROM clock_timestamp() - xact_start)::numeric, 1)
                       AS open_s,
                   left(regexp_replace(query, '\s+', ' ', 'g'), 80) AS query
            FROM pg_stat_activity
            WHERE datname = current_database() AND pid <> pg_backend_pid()
              AND state <> 'idle'
            """
        )
        return [dict(r) for r in rows]

    async def writing_runs(self) -> set[tuple[int, str]]:
        """(pid, transaction id) of the open transactions that have written runs."""
        rows = await self.conn.fetch(
            """
            SELECT DISTINCT a.pid, a.backend_xid::text AS xid
            FROM pg_stat_activity a
            JOIN pg_locks l ON l.pid = a.pid AND l.relation = 'runs'::regclass
                 AND l.mode = 'RowExclusiveLock'
            WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
              AND a.backend_xid IS NOT NULL
            """
        )
        return {(r["pid"], r["xid"]) for r in rows}

    async def dispatches(self) -> list[Dispatch]:
        rows = await self.conn.fetch(
            """
            SELECT r.id AS run_id, r.job_id, r.shard, r.state, r.fire_at, r.dispatched_at,
                   e.id AS event_id, e.at, e.actor, e.reason
            FROM runs r
            LEFT JOIN events e ON e.run_id = r.id AND e.kind = 'run.transition'
                 AND e.from_state = 'SCHEDULED' AND e.to_state = 'DISPATCHED'
            ORDER BY r.id, e.id
            """
        )
        return [Dispatch(**dict(r)) for r in rows]

    async def histories(self) -> dict[uuid.UUID, list[tuple[str | None, str | None]]]:
        rows = await self.conn.fetch(
            "SELECT run_id, from_state, to_state FROM events"
            " WHERE kind = 'run.transition' ORDER BY id"
        )
        out: dict[uuid.UUID, list[tuple[str | None, str | None]]] = defaultdict(list)
        for r in rows:
            out[r["run_id"]].append((r["from_state"], r["to_state"]))
        return out


@dataclass
class Timeline:
    """Instants of the scenario, ``base + t``, on the database's clock."""

    base: datetime
    offset: timedelta  # database clock minus local clock

    @classmethod
    async def starting_in(cls, db: Db, lead: float) -> Timeline:
        offset = await db.now() - datetime.now(UTC)
        return cls(base=datetime.now(UTC) + offset + timedelta(seconds=lead), offset=offset)

    def t(self, seconds: float) -> datetime:
        return self.base + timedelta(seconds=seconds)

    async def reach(self, seconds: float) -> None:
        """Wait until ``base + seconds`` (at once if it has passed)."""
        left = (self.t(seconds) - (datetime.now(UTC) + self.offset)).total_seconds()
        await asyncio.sleep(max(0.0, left))


async def create_runs(cluster: Cluster, key: str, dues: Sequence[datetime]) -> list[str]:
    """One-off jobs due at ``dues``, through the batch endpoint; their ids."""
    ids: list[str] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=cluster.url, headers=headers, timeout=60) as client:
        for start in range(0, len(dues), 1000):
            jobs = [
                {
                    "name": f"run-{start + i}",
                    "schedule": {"at": due.isoformat()},
                    "task": "cluster.noop",
                    "pool": "cluster",
                }
                for i, due in enumerate(dues[start : start + 1000])
            ]
            r = await client.post("/v1/jobs/batch", json={"jobs": jobs})
            assert r.status_code == 201, r.text
            ids += [job["id"] for job in r.json()["items"]]
    return ids


async def start_node(cluster: Cluster, db: Db, name: str) -> str:
    """Start a scheduler node; wait until it holds a share of the shards."""
    node = cluster.start_scheduler(name, env=NODE_ENV)

    async def has_share() -> bool:
        return bool((await db.held()).get(node))

    await cluster.wait_until(has_share, 30, what=f"{node} holds shards")
    return node


def check_exactly_once(
    rows: list[Dispatch],
    histories: dict[uuid.UUID, list[tuple[str | None, str | None]]],
    job_ids: set[str],
    nodes: set[str],
) -> dict[uuid.UUID, Dispatch]:
    """The invariants every scenario keeps; returns each run's one dispatch."""
    events: dict[uuid.UUID, list[Dispatch]] = defaultdict(list)
    for row in rows:
        events[row.run_id].append(row)
    assert {str(row.job_id) for row in rows} == job_ids, "runs lost or made up"
    assert len(events) == len(job_ids), "a job with more or fewer than one run"

    twice = {run: [(d.actor, d.at) for d in ds] for run, ds in events.items() if len(ds) > 1}
    assert not twice, f"{len(twice)} runs dispatched more than once, e.g. {_some(twice)}"
    never = [run for run, ds in events.items() if ds[0].event_id is None]
    assert not never, f"{len(never)} runs never dispatched, e.g. {never[:3]}"
    once = {run: ds[0] for run, ds in events.items()}
    not_dispatched = {run: d.state for run, d in once.items() if d.state != "DISPATCHED"}
    assert not not_dispatched, f"runs not in DISPATCHED: {_some(not_dispatched)}"

    # Every recorded transition of every run is one the state machine allows.
    pairs = {(a, b) for h in histories.values() for a, b in h if b is not None}
    assert illegal_transitions(pairs) == [], "transitions the state machine does not allow"
    wrong = {run: h for run, h in histories.items() if run in once and h != HISTORY}
    assert not wrong, f"{len(wrong)} runs with another history, e.g. {_some(wrong)}"
    assert set(once) <= set(histories)

    unknown = {d.actor for d in once.values()} - nodes
    assert not unknown, f"dispatched by {unknown}, not one of the nodes started {nodes}"
    for d in once.values():
        assert d.at is not None
        assert d.at == d.dispatched_at, f"event and run disagree on the instant: {d}"
        assert d.late >= 0, f"dispatched {-d.late:.3f} s early: {d}"
        if d.late > LATE:
            assert d.reason and "after its due time" in d.reason, f"late, no reason: {d}"
    return once


def _some(mapping: Mapping[uuid.UUID, object]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in list(mapping.items())[:3])


# -- the scenarios --------------------------------------------------------------------


async def test_joins_leaves_pauses_and_kills_dispatch_every_run_exactly_once(
    pg_url: str, tmp_path: Path
) -> None:
    cluster = Cluster(database_url=pg_url, workdir=tmp_path)
    db = await Db.connect(pg_url)
    try:
        cluster.start("api", "api", "--port", str(cluster.port))
        await cluster.wait_ready()
        nodes = {await start_node(cluster, db, "node-0")}
        keys = [(await cluster.tenant(f"tenant-{i}"))[1] for i in range(4)]

        # Per tenant: 5 runs at each of 140 instants (every 0.25 s from t=1 to t=35.75),
        # and 300 more at one instant, the spike, when node-0 is killed.
        spike = 20.1
        clock = await Timeline.starting_in(db, lead=6.0)
        stream = [clock.t(1 + i * 0.25) for i in range(140) for _ in range(5)]
        dues = stream + [clock.t(spike)] * 300
        made = await asyncio.gather(*(create_runs(cluster, key, dues) for key in keys))
        job_ids = {job for ids in made for job in ids}
        assert len(job_ids) == 4 * len(dues)

        # Two nodes join: node-0 hands shards back to each.
        await clock.reach(4)
        nodes.add(await start_node(cluster, db, "node-1"))
        await clock.reach(8)
        nodes.add(await start_node(cluster, db, "node-2"))

        # node-1 is frozen until the others have taken all its shards, and a lease TTL
        # more; then thawed: it must not fire anything it lost.
        await clock.reach(12)
        frozen = (await db.held())["node-1"]
        cluster.pause("node-1")
        paused_at = await db.now()

        async def taken_over() -> bool:
            held = await db.held()
            return "node-1" not in held and frozen <= held["node-0"] | held["node-2"]

        await cluster.wait_until(taken_over, 30, what="node-0 and node-2 take over node-1's shards")
        await asyncio.sleep(TTL)
        resume_mark = await db.mark()
        cluster.resume("node-1")
        resumed_at = await db.now()

        # kill -9 of node-0 once the spike is being dispatched.
        await clock.reach(spike)

        async def spiking() -> bool:
            return await db.scheduled(due_by=clock.t(spike)) < 4 * 300

        await cluster.wait_until(spiking, 30, what="the spike is being dispatched")
        doomed = (await db.held())["node-0"]
        cluster.kill("node-0")
        killed_at = await db.now()
        assert doomed, "node-0 held no shard when it was killed"

        # A replacement joins; node-2 leaves gracefully, handing its shards back.
        await clock.reach(spike + 4)
        nodes.add(await start_node(cluster, db, "node-3"))
        await clock.reach(29)
        assert cluster.terminate("node-2") == 0, cluster.log("node-2")[-3000:]
        assert await db.owned_by("node-2") == 0, "node-2 left without releasing its shards"

        await clock.reach(36)

        async def all_dispatched() -> bool:
            return await db.scheduled() == 0

        await cluster.wait_until(all_dispatched, 60, what="every run is dispatched")
        once = check_exactly_once(await db.dispatches(), await db.histories(), job_ids, nodes)
        assert any(d.late > LATE for d in once.values()), "no run was late: faults not felt"

        # The frozen node fired nothing due while it was frozen: it could not issue a
        # statement then, and after thawing it must not fire what it lost.
        for d in once.values():
            assert d.at is not None and d.event_id is not None
            if d.actor == "node-1" and d.fire_at > paused_at:
                assert d.event_id > resume_mark, f"node-1 fired while frozen: {d}"
            # Its shards' runs went out within a takeover of their due time.
            if d.shard in frozen and paused_at <= d.fire_at < resumed_at:
                bound = max(d.fire_at, paused_at + timedelta(seconds=TTL))
                assert d.at <= bound + timedelta(seconds=SLACK), f"takeover too slow: {d}"

        # The killed node's shards: every run it had not fired went out from the new
        # owners, late by at most the takeover time.
        taken = [d for d in once.values() if d.shard in doomed and d.actor != "node-0"]
        assert any(d.fire_at >= killed_at for d in taken)
        for d in once.values():
            assert d.at is not None
            if d.actor == "node-0":
                assert d.at <= killed_at, f"node-0 fired after it was killed: {d}"
        for d in taken:
            assert d.at is not None
            bound = max(d.fire_at, killed_at + timedelta(seconds=TTL))
            assert d.at <= bound + timedelta(seconds=SLACK), f"failover too slow: {d}"
    finally:
        cluster.stop()
        await db.close()


async def freeze(cluster: Cluster, db: Db, name: str, *, mid_fire: bool) -> datetime:
    """``SIGSTOP`` the only scheduler node, ``name``, at the chosen moment: inside a
    transaction that has written runs (a fire batch, its rows locked, not committed), or
    outside any transaction. Tries until the node is seen frozen there; returns when."""

    async def frozen() -> datetime | None:
        """One try: the instant it froze there, or None (thawed again)."""
        if mid_fire:
            writing = await db.writing_runs()
            if writing:
                cluster.pause(name)
                await asyncio.sleep(0.3)  # what it had sent before the stop completes
                if writing & await db.writing_runs():
                    return await db.now()
                cluster.resume(name)
        elif not await db.sessions():
            cluster.pause(name)
            await asyncio.sleep(0.3)
            if not await db.sessions():
                return await db.now()
            cluster.resume(name)
        return None

    moment = "inside a fire transaction" if mid_fire else "between transactions"
    at: datetime = await cluster.wait_until(
        frozen, 30, what=f"{name} frozen {moment}", interval=0.002 if mid_fire else 0.01
    )
    return at


@pytest.mark.parametrize("mid_fire", [False, True], ids=["between-passes", "mid-fire"])
async def test_a_node_frozen_holding_every_shard_fires_nothing_it_lost(
    pg_url: str, tmp_path: Path, mid_fire: bool
) -> None:
    cluster = Cluster(database_url=pg_url, workdir=tmp_path)
    db = await Db.connect(pg_url)
    every_shard = set(range(NUM_SHARDS))
    try:
        cluster.start("api", "api", "--port", str(cluster.port))
        await cluster.wait_ready()
        a = cluster.start_scheduler("node-a", env=NODE_ENV)

        async def a_holds_all() -> bool:
            return (await db.held()).get(a) == every_shard

        await cluster.wait_until(a_holds_all, 30, what=f"{a} holds every shard")
        keys = [(await cluster.tenant(f"tenant-{i}"))[1] for i in range(2)]

        # Per tenant: a burst (several fire batches) when node-a is frozen, a stream due
        # while it is, and some runs due after it is thawed.
        clock = await Timeline.starting_in(db, lead=5.0)
        burst = [clock.t(2)] * 2500
        stream = [clock.t(3 + i * 0.25) for i in range(24) for _ in range(10)]
        after = [clock.t(14 + i * 0.25) for i in range(8) for _ in range(10)]
        dues = burst + stream + after
        made = await asyncio.gather(*(create_runs(cluster, key, dues) for key in keys))
        job_ids = {job for ids in made for job in ids}

        await clock.reach(1.8)
        paused_at = await freeze(cluster, db, a, mid_fire=mid_fire)
        b = cluster.start_scheduler("node-b", env=NODE_ENV)

        async def b_holds_all() -> bool:
            return (await db.held()).get(b) == every_shard

        async def due_dispatched() -> bool:
            return await db.scheduled(due_by=clock.t(9)) == 0

        await cluster.wait_until(b_holds_all, 30, what=f"{b} takes over every shard of frozen {a}")
        try:
            await cluster.wait_until(
                due_dispatched, 20, what=f"{b} dispatches what falls due while {a} is frozen"
            )
        except AssertionError as exc:
            still = await db.scheduled(due_by=clock.t(9))
            pytest.fail(f"{exc}: {still} runs still SCHEDULED; sessions: {await db.sessions()}")
        left = (paused_at + timedelta(seconds=3 * TTL) - await db.now()).total_seconds()
        await asyncio.sleep(max(0.0, left))  # frozen for three lease TTLs at least
        resume_mark = await db.mark()
        cluster.resume(a)
        resumed_at = await db.now()

        # Thawed, node-a finds its leases gone and takes a fair share back cleanly.
        async def shared() -> bool:
            held = await db.held()
            return bool(held.get(a)) and held[a] | held[b] == every_shard

        await cluster.wait_until(shared, 30, what=f"{a} and {b} share the shards")

        async def all_dispatched() -> bool:
            return await db.scheduled() == 0

        await cluster.wait_until(all_dispatched, 30, what="every run is dispatched")
        once = check_exactly_once(await db.dispatches(), await db.histories(), job_ids, {a, b})

        stale = [
            d
            for d in once.values()
            if d.actor == a
            and d.event_id is not None
            and d.event_id > resume_mark
            and d.fire_at <= resumed_at
        ]
        assert not stale, f"{a} fired {len(stale)} runs after it was thawed, e.g. {stale[:3]}"
        while_frozen = [d for d in once.values() if paused_at < d.fire_at <= resumed_at]
        assert while_frozen
        assert {d.actor for d in while_frozen} == {b}
        for d in while_frozen:
            assert d.at is not None
            bound = max(d.fire_at, paused_at + timedelta(seconds=TTL))
            assert d.at <= bound + timedelta(seconds=SLACK), f"takeover too slow: {d}"
        assert "shard leases lost" in cluster.log(a)
    finally:
        cluster.stop()
        await db.close()
