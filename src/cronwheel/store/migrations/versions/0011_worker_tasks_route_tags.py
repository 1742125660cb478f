"""workers.tasks and runs.route_tags: a worker declares the tasks it runs and leases
only those; a run of a job with route tags is leased only by a worker whose tags
include them all

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 09:00:00

Workers registered before declare no tasks (NULL: any task, as before); runs made
before have no route tags (``[]``). Jobs keep their stored template: a template
without ``route_tags`` reads as none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import Json

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("tasks", Json, nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("route_tags", Json, nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("route_tags")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("tasks")
