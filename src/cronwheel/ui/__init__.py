"""The dashboard at ``/ui``: server-rendered pages over the API's own routes and store,
signed in with an API key (``ui/sessions.py``), served by every API node.

Pages come from Jinja2 templates in the package, styles and the one script from its
``static`` folder, charts as inline SVG drawn on the server (``ui/charts.py``): nothing
is fetched from anywhere else, and nothing is built.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRouter
from starlette.staticfiles import StaticFiles

__all__ = ["STATIC_PATH", "mount_ui", "ui_routers"]

STATIC_PATH = "/ui/static"


def ui_routers() -> list[APIRouter]:
    """The dashboard's routers, the catch-all (an unknown page) last."""
    from cronwheel.ui import fleet, jobs, overview, runs, signin, workflows

    return [
        overview.router,
        jobs.router,
        workflows.router,
        runs.router,
        fleet.router,
        signin.router,
    ]


def mount_ui(app: FastAPI) -> list[APIRouter]:
    """Serve the dashboard from ``app``: its static files, then its pages. Returns the
    routers included."""
    app.mount(STATIC_PATH, StaticFiles(packages=[("cronwheel.ui", "static")]), name="ui-static")
    routers = ui_routers()
    for router in routers:
        app.include_router(router)
    return routers
