"""``cronwheel``: run the server, its parts, a worker or the demo; talk to the API.

Exit codes: 0 success, 1 an error (printed in red on stderr), 2 a usage error.

The root app is here; each group of commands has its module (``jobs``, and
``job_edit`` for ``jobs edit``; ``runs``, ``workflows``, ``tenants``, ``workers``,
``pools``, ``schedule``, ``dlq``, ``alerts``, ``audit``, ``top``, ``bulk`` and
``operations``; ``server`` for the processes and the database), sharing ``options``
(the connection options and the client they make) and ``output`` (consoles, tables,
errors and exit codes).
"""

from __future__ import annotations

from typing import Annotated

import typer

from cronwheel.cli.alerts import alerts
from cronwheel.cli.audit import audit
from cronwheel.cli.bulk import bulk_app, operations_app
from cronwheel.cli.dlq import dlq_app
from cronwheel.cli.job_edit import jobs_edit
from cronwheel.cli.jobs import jobs_app
from cronwheel.cli.output import command_group, console
from cronwheel.cli.overrides import overrides_app
from cronwheel.cli.pools import pools_app
from cronwheel.cli.runs import runs_app
from cronwheel.cli.schedule import schedule_app
from cronwheel.cli.server import api, db_app, demo, scheduler, server, worker
from cronwheel.cli.tenants import tenants_app
from cronwheel.cli.top import top
from cronwheel.cli.workers import workers_app
from cronwheel.cli.workflows import workflows_app
from cronwheel.version import package_version

__all__ = ["app", "main"]

app = command_group(
    "cronwheel: a multi-tenant distributed job scheduler.",
    name="cronwheel",
    pretty_exceptions_enable=False,
)


def _print_version(wanted: bool) -> None:
    if wanted:
        console.print(f"cronwheel {package_version()}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print cronwheel's version and exit.",
        ),
    ] = False,
) -> None:
    """cronwheel: a multi-tenant distributed job scheduler."""


# --help lists the commands in the order they are added here, then the groups.
jobs_app.command("edit")(jobs_edit)
app.add_typer(jobs_app, name="jobs")
app.add_typer(runs_app, name="runs")
app.add_typer(workflows_app, name="workflows")
app.add_typer(tenants_app, name="tenants")
app.add_typer(workers_app, name="workers")
app.add_typer(pools_app, name="pools")
app.add_typer(schedule_app, name="schedule")
app.add_typer(dlq_app, name="dlq")
app.add_typer(bulk_app, name="bulk")
app.add_typer(operations_app, name="operations")
app.add_typer(overrides_app, name="overrides")
app.add_typer(db_app, name="db")
app.command("alerts")(alerts)
app.command("audit")(audit)
app.command("top")(top)
app.command()(server)
app.command()(api)
app.command()(scheduler)
app.command()(demo)
app.command()(worker)


def main() -> None:
    app()
