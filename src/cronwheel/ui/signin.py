"""Signing in and out, and the dashboard's front door."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import HTMLResponse

from cronwheel.domain.errors import NotFoundError, PermissionDeniedError, ValidationError
from cronwheel.ui.render import SECURITY_HEADERS, UiRoute, page, redirect
from cronwheel.ui.sessions import (
    SignInRequired,
    Visit,
    check_sign_in_csrf,
    checked_form,
    end_session,
    read_form,
    sign_in_token,
    signed_in,
    start_session,
)

__all__ = ["router"]

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)


@router.get("")
async def front_door(request: Request) -> Response:
    return redirect("/ui/overview")


def _sign_in_form(
    request: Request, *, status_code: int = 200, reason: str | None = None, error: str = ""
) -> HTMLResponse:
    answer = HTMLResponse("", headers=SECURITY_HEADERS)
    csrf = sign_in_token(request, answer)
    shown = page(
        "sign_in.html",
        None,
        status_code=status_code,
        title="Sign in",
        csrf=csrf,
        reason=reason,
        error=error,
    )
    for name, value in answer.raw_headers:
        if name == b"set-cookie":
            shown.raw_headers.append((name, value))
    return shown


@router.get("/sign-in")
async def sign_in_page(
    request: Request, reason: str = Query(default="", max_length=200)
) -> Response:
    try:
        await signed_in(request)
    except SignInRequired:
        known = {
            "your session has expired: sign in again",
            "the API key of your session is no longer valid: sign in again",
        }
        return _sign_in_form(request, reason=reason if reason in known else None)
    return redirect("/ui/overview")


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    form = await read_form(request)
    check_sign_in_csrf(request, form)
    answer = redirect("/ui/overview")
    try:
        principal = await start_session(request, answer, form.one("api_key"))
    except ValidationError as exc:
        return _sign_in_form(request, status_code=401, error=exc.message.partition(": ")[2])
    except PermissionDeniedError as exc:
        return _sign_in_form(request, status_code=403, error=exc.message)
    if principal.is_admin:
        answer.headers["Location"] = "/ui/tenants"
    return answer


@router.post("/sign-out")
async def sign_out(request: Request, visit: Visit = Depends(signed_in)) -> Response:
    await checked_form(request, visit)
    answer = redirect("/ui/sign-in")
    await end_session(request, answer, visit)
    return answer


@router.get("/{rest:path}")
async def unknown_page(rest: str, request: Request, visit: Visit = Depends(signed_in)) -> Response:
    raise NotFoundError(f"no page /ui/{rest}")
