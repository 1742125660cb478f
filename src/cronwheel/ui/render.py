"""Pages out of the package's Jinja2 templates, and what every dashboard answer shares:
its security headers, and errors shown as pages (the API's errors are JSON)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from cronwheel.domain.errors import CronwheelError
from cronwheel.ui.sessions import SignInRequired, TenantNotChosen, Visit

__all__ = [
    "NOTICES",
    "SECURITY_HEADERS",
    "UiRoute",
    "clock",
    "duration",
    "first_line",
    "instant",
    "lateness",
    "page",
    "redirect",
    "svg",
    "wall_time",
]

log = logging.getLogger("cronwheel.ui")

# Nothing but the page's own origin: no inline script, no CDN, no framing.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def instant(value: datetime | None, *, seconds: bool = True) -> str:
    """An instant in UTC, as every page shows them."""
    if value is None:
        return "—"
    fmt = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    return value.astimezone(UTC).strftime(fmt) + " UTC"


def duration(seconds: float | None) -> str:
    """A length of time in a few characters: ``850 ms``, ``12.3 s``, ``4 min 5 s``."""
    if seconds is None:
        return "—"
    if abs(seconds) < 1:
        return f"{seconds * 1000:.0f} ms"
    if abs(seconds) < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if abs(whole) < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if abs(whole) < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def first_line(text: str | None, limit: int = 200) -> str:
    """The first line of a message (an error's traceback stays on the run's page)."""
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def lateness(seconds: float) -> str:
    """How late (``+41 ms``) or early (``393 ms early``) something happened."""
    return f"+{duration(seconds)}" if seconds >= 0 else f"{duration(-seconds)} early"


def wall_time(text: str) -> str:
    """A local wall time with its offset (``2026-12-06T02:30:00+01:00``) as pages show
    instants: ``2026-12-06 02:30:00 +01:00``; anything else as it is."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return text
    offset = parsed.strftime("%z")
    shown = f" {offset[:3]}:{offset[3:]}" if offset else ""
    return parsed.strftime("%Y-%m-%d %H:%M:%S") + shown


def clock(value: datetime) -> str:
    """A log line's time: ``22:10:52.211`` (UTC)."""
    return value.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]


def _pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _query(base: str, **params: Any) -> str:
    """``base`` with the given query parameters, those None or empty left out."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{base}?{urlencode(kept, doseq=True)}" if kept else base


_ENV = Environment(
    loader=PackageLoader("cronwheel.ui", "templates"),
    autoescape=select_autoescape(["html"]),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters["instant"] = instant
_ENV.filters["duration"] = duration
_ENV.filters["pretty_json"] = _pretty_json
_ENV.filters["first_line"] = first_line
_ENV.filters["clock"] = clock
_ENV.filters["lateness"] = lateness
_ENV.filters["wall_time"] = wall_time
_ENV.globals["query"] = _query


# The notices a redirect may ask a page to show: only these, never text from the URL.
NOTICES = frozenset(
    {
        "Paused",
        "Resumed",
        "Cancelled",
        "Triggered",
        "Redriven",
        "Retried",
        "choose a tenant to look at",
    }
)


def page(
    template: str,
    visit: Visit | None,
    *,
    status_code: int = 200,
    title: str = "",
    section: str = "",
    **context: Any,
) -> HTMLResponse:
    html = _ENV.get_template(template).render(
        visit=visit,
        title=title,
        section=section,
        notice=notice if (notice := context.pop("notice", None)) in NOTICES else None,
        **context,
    )
    return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)


def svg(markup: str) -> Markup:
    """Markup made by ``ui.charts`` (which escapes every text it puts in)."""
    return Markup(markup)


def redirect(url: str) -> RedirectResponse:
    """After a POST: the page to show, fetched with a GET."""
    return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)


def _error_page(request: Request, status: int, message: str) -> Response:
    if request.url.path.endswith(".json"):
        return JSONResponse({"error": {"code": "ui_error", "message": message}}, status_code=status)
    return page(
        "error.html",
        getattr(request.state, "visit", None),
        status_code=status,
        title={403: "Not allowed", 404: "Not found", 409: "Not now"}.get(status, "Error"),
        message=message,
        status=status,
    )


class UiRoute(APIRoute):
    """A dashboard route: a missing session sends the browser to sign in (a script's
    request gets 401), the admin without a tenant to the tenants page, and an error is a
    page with its status (403, 404, 409, …) rather than the API's JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired as exc:
                if request.method != "GET":
                    return _error_page(request, 403, "sign in first")
                if request.url.path.endswith(".json"):
                    return _error_page(request, 401, exc.message or "sign in first")
                return redirect(_query("/ui/sign-in", reason=exc.message))
            except TenantNotChosen:
                return redirect(_query("/ui/tenants", notice="choose a tenant to look at"))
            except CronwheelError as exc:
                return _error_page(request, exc.status, exc.message)
            except RequestValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {}
                where = ".".join(str(p) for p in first.get("loc", ())[1:])
                return _error_page(request, 422, f"{where}: {first.get('msg', 'invalid')}")

        return handle
