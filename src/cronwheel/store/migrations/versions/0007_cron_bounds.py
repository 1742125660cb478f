"""jobs.schedule.cron: a stored cron expression that the cron bounds now refuse is
rewritten to one that fires at the same instants

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 16:00:00

The scheduler and the preview parse a job's stored expression every time: one that the
parser now refuses would fail every scheduler pass, for every tenant. Before the
bounds, croniter read a reversed range as wrapping around (``22-2``: 22, 23, 0, 1, 2)
and a step longer than its field as the field's first value, so each field that breaks
a bound is written as the values it was read as: every job keeps firing as before. A
field led by ``*`` or ``?`` stays so (the day rule depends on it), through ``*/size``,
which names the field's first value. Each rewrite goes on the job's audit trail.

Only jobs that may still fire (active, paused) are read. Whether an expression is
refused is asked of this version's parser, so a rewrite is one it accepts. An
expression that cannot be written within the bounds (only one built to probe them
could be) stops the upgrade, naming its job, to be cancelled or changed with the
previous version first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op
from croniter import croniter

from cronwheel.domain.errors import InvalidScheduleError
from cronwheel.domain.spec import MAX_CRON_LENGTH
from cronwheel.store.schema import Json, UtcDateTime, Uuid
from cronwheel.timing.cron import CronExpr, parse_cron

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

ACTOR = "migration 0007"

# The six fields in the order of a 6-field expression: the CronExpr attribute, the
# first value, how many distinct values.
_FIELDS = (
    ("seconds", 0, 60),
    ("minutes", 0, 60),
    ("hours", 0, 24),
    ("days", 1, 31),
    ("months", 1, 12),
    ("weekdays", 0, 7),
)

_jobs = sa.table(
    "jobs",
    sa.column("id", Uuid),
    sa.column("tenant_id", Uuid),
    sa.column("state", sa.String),
    sa.column("kind", sa.String),
    sa.column("schedule", Json),
    sa.column("version", sa.Integer),
    sa.column("updated_at", UtcDateTime),
)
_events = sa.table(
    "events",
    sa.column("tenant_id", Uuid),
    sa.column("at", UtcDateTime),
    sa.column("kind", sa.String),
    sa.column("job_id", Uuid),
    sa.column("actor", sa.String),
    sa.column("reason", sa.Text),
    sa.column("data", Json),
)


def _parses(expr: str) -> CronExpr | None:
    try:
        return parse_cron(expr)
    except InvalidScheduleError:
        return None


def _item_values(item: str, position: int, count: int) -> frozenset[int]:
    """What one list item of field ``position`` (of ``count``) was read as."""
    probe = ["*"] * count
    probe[position] = item
    attribute, low, size = _FIELDS[position + 6 - count]
    parsed = _parses(" ".join(probe))
    if parsed is not None:  # the bounds only refuse: what they accept reads as before
        return frozenset(getattr(parsed, attribute))
    # croniter's order puts a leading second field last.
    expanded = croniter.expand(" ".join(probe), second_at_beginning=count == 6)[0]
    read = expanded[(position - 1) % 6 if count == 6 else position]
    if read == ["*"]:
        return frozenset(range(low, low + size))
    return frozenset(int(v) % 7 if attribute == "weekdays" else int(v) for v in read)


def _ranges(values: Iterable[int]) -> list[str]:
    runs: list[list[int]] = []
    for v in sorted(values):
        if runs and runs[-1][-1] == v - 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return [str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs]


def _field(text: str, position: int, count: int) -> str:
    """The field written as the values it was read as, within the bounds."""
    values = frozenset[int]().union(
        *(_item_values(item, position, count) for item in text.lower().split(","))
    )
    _attribute, low, size = _FIELDS[position + 6 - count]
    if not text.startswith(("*", "?")):
        return ",".join(_ranges(values))
    if values == frozenset(range(low, low + size)):
        return "*"
    return ",".join([f"*/{size}", *_ranges(values - {low})])  # a '*' item reads low


def _rewritten(expr: str) -> str:
    """``expr`` with each field that breaks a bound written as the values it was read
    as; every field if the expression is still too long."""
    fields = expr.split()
    count = len(fields)

    def accepted(position: int, text: str) -> bool:
        probe = ["*"] * count
        probe[position] = text
        return _parses(" ".join(probe)) is not None

    kept = [t if accepted(i, t) else _field(t, i, count) for i, t in enumerate(fields)]
    new = " ".join(kept)
    if len(new) > MAX_CRON_LENGTH:
        new = " ".join(_field(t, i, count) for i, t in enumerate(fields))
    return new


def _rewrites(rows: Sequence[Any]) -> list[tuple[Any, str]]:
    found: list[tuple[Any, str]] = []
    stuck: list[str] = []
    for row in rows:
        old = row.schedule["cron"]
        if _parses(old) is not None:
            continue
        try:
            new = _rewritten(old)
        except ValueError:  # croniter refuses a piece alone: no reading to keep
            new = old
        if _parses(new) is None:
            stuck.append(f"job {row.id} (tenant {row.tenant_id}): {old[:100]!r}")
            continue
        found.append((row, new))
    if stuck:
        raise RuntimeError(
            "the cron expressions of these jobs break the cron bounds and cannot be "
            "rewritten within them; cancel the jobs or recreate them with a shorter "
            "expression, using the previous version, then upgrade again:\n" + "\n".join(stuck)
        )
    return found


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(_jobs.c.id, _jobs.c.tenant_id, _jobs.c.schedule, _jobs.c.version).where(
            _jobs.c.kind == "cron", _jobs.c.state.in_(("active", "paused"))
        )
    ).all()
    found = _rewrites(rows)
    if not found:
        return
    # The database clock, as the store reads it (SQLite's is this process's).
    if conn.dialect.name == "postgresql":
        now = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    else:
        now = datetime.now(UTC)
    for row, new in found:
        conn.execute(
            _jobs.update()
            .where(_jobs.c.id == row.id)
            .values(
                schedule={**row.schedule, "cron": new},
                version=row.version + 1,
                updated_at=now,
            )
        )
    conn.execute(
        _events.insert(),
        [
            {
                "tenant_id": row.tenant_id,
                "at": now,
                "kind": "job.schedule_rewritten",
                "job_id": row.id,
                "actor": ACTOR,
                "reason": "the cron bounds refuse the expression; rewritten to fire at "
                "the same instants",
                "data": {"from": row.schedule["cron"], "to": new},
            }
            for row, new in found
        ],
    )


def downgrade() -> None:
    # The rewritten expressions fire as the old ones did and the previous version
    # accepts them: nothing to undo.
    pass
