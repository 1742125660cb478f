"""workflows: jobs.workflow, runs.workflow_run_id and runs.node, the PENDING state

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06 02:40:00

A workflow is a job whose ``workflow`` holds its DAG (``domain/workflow.py``). Its runs
are workflow runs, and node runs that carry the workflow run's id and their node's
name. The node joins the runs' unique key, so one workflow run's nodes may share a due
instant; every other run has the node ''. Node runs wait PENDING for their upstream
nodes, and come from the origin ``node``. ``ix_runs_workflow`` finds a workflow run's
nodes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from cronwheel.store.schema import OptionalJson, Uuid

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

_STATES = "'CANCELLED', 'DEAD_LETTER', 'DISPATCHED', 'FAILED', 'RUNNING', 'SCHEDULED', 'SKIPPED', 'SUCCESS'"
_ORIGINS = "'once', 'schedule', 'trigger', 'backfill', 'replay'"
_WORKFLOW = "workflow_run_id IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("workflow", OptionalJson, nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("workflow_run_id", Uuid, nullable=True))
        batch.add_column(sa.Column("node", sa.String(100), server_default="", nullable=False))
        batch.drop_constraint(op.f("uq_runs_tenant_id_job_id_due_at"), type_="unique")
        batch.create_unique_constraint(
            op.f("uq_runs_tenant_id_job_id_due_at_node"), ["tenant_id", "job_id", "due_at", "node"]
        )
        batch.drop_constraint(op.f("ck_runs_state"), type_="check")
        batch.create_check_constraint("state", f"state IN ('PENDING', {_STATES})")
        batch.drop_constraint(op.f("ck_runs_origin"), type_="check")
        batch.create_check_constraint("origin", f"origin IN ({_ORIGINS}, 'node')")
    op.create_index(
        "ix_runs_workflow",
        "runs",
        ["workflow_run_id", "node"],
        postgresql_where=sa.text(_WORKFLOW),
        sqlite_where=sa.text(_WORKFLOW),
    )


def downgrade() -> None:
    # Workflows go: their jobs (and with them their runs) are deleted first, so that
    # what is left fits the older constraints.
    op.execute("DELETE FROM jobs WHERE workflow IS NOT NULL")
    op.drop_index("ix_runs_workflow", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(op.f("ck_runs_origin"), type_="check")
        batch.create_check_constraint("origin", f"origin IN ({_ORIGINS})")
        batch.drop_constraint(op.f("ck_runs_state"), type_="check")
        batch.create_check_constraint("state", f"state IN ({_STATES})")
        batch.drop_constraint(op.f("uq_runs_tenant_id_job_id_due_at_node"), type_="unique")
        batch.create_unique_constraint(
            op.f("uq_runs_tenant_id_job_id_due_at"), ["tenant_id", "job_id", "due_at"]
        )
        batch.drop_column("node")
        batch.drop_column("workflow_run_id")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("workflow")
