"""Dashboard sign-in: an API key typed into a form buys a server-side session.

::

    sign-in form ──key──▶ key valid? ──▶ session row (hash of a random token) ──▶ cookie
    every request: cookie ─▶ session row, not expired ─▶ its key still valid? ─▶ Visit
                                  │ no                        │ no (revoked, deleted)
                                  ▼                           ▼
                             sign in again          session deleted, sign in again

- The cookie holds a random token (32 bytes); the database keeps only its SHA-256, so
  reading the table gives no one a session. Every API node shares the table.
- The cookie is ``HttpOnly``, ``SameSite=Strict``, ``Path=/ui``, and ``Secure`` when
  the page came over https.
- The session keeps the hash of the key it signed in with, never the key; the key is
  looked up on every request (through the API's key cache, which every node's
  revocations empty at once), so a revoked key ends its sessions, and its role — admin,
  operator, viewer — is the key's, as on the API.
- Every form carries a CSRF token derived from the session's token (an HMAC of it): a
  POST without it, or with another, is refused 403 and changes nothing. The sign-in
  form, which comes before any session, carries one tied to a cookie of its own.
- A session expires after ``ui_session_idle`` seconds unused (12 hours) and after
  ``ui_session_lifetime`` seconds at most (7 days). Its expiry moves forward when its
  last use is a minute old: a page view is one read, not a write.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import parse_qs

from fastapi import Request, Response

from cronwheel.api.auth import KEY_PREFIX, MAX_KEY_LENGTH, Principal, TenantScope, hash_key
from cronwheel.api.state import api_state
from cronwheel.domain.errors import NotFoundError, PermissionDeniedError, ValidationError
from cronwheel.store.values import UiSession

__all__ = [
    "COOKIE_PATH",
    "SESSION_COOKIE",
    "SIGN_IN_COOKIE",
    "Form",
    "SignInRequired",
    "TenantNotChosen",
    "Visit",
    "check_sign_in_csrf",
    "checked_form",
    "csrf_of",
    "end_session",
    "principal_of_key",
    "read_form",
    "sign_in_token",
    "signed_in",
    "start_session",
]

SESSION_COOKIE = "cronwheel_session"
SIGN_IN_COOKIE = "cronwheel_sign_in"
COOKIE_PATH = "/ui"
_TOKEN_MAX = 100
_TOUCH_EVERY = timedelta(seconds=60)
_FORM_MAX_FIELDS = 200


class SignInRequired(Exception):
    """No valid session: the browser is sent to the sign-in page."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or "")
        self.message = message


class TenantNotChosen(Exception):
    """The admin opened a tenant's page before choosing a tenant."""


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def csrf_of(token: str) -> str:
    """The CSRF token of the session (or sign-in cookie) ``token``: only a page that
    holds the cookie's value, which scripts cannot read, can make it."""
    return hmac.new(token.encode(), b"cronwheel-ui-csrf", hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Visit:
    """A request from a signed-in browser: who, through which session."""

    principal: Principal
    session: UiSession
    csrf: str
    tenant_id: uuid.UUID | None  # the tenant whose pages it sees (None: the admin chose none)
    tenant_name: str | None

    @property
    def may_write(self) -> bool:
        return self.principal.role in ("admin", "operator")

    @property
    def is_admin(self) -> bool:
        return self.principal.is_admin

    @property
    def scope(self) -> TenantScope:
        """The tenant the pages are about, as the API's routes take it."""
        if self.tenant_id is None:
            raise TenantNotChosen
        return TenantScope(principal=self.principal, tenant_id=self.tenant_id)

    def writer_scope(self) -> TenantScope:
        """:attr:`scope` for a change: refused (403) to a viewer key, as on the API."""
        if not self.may_write:
            raise PermissionDeniedError(f"a {self.principal.role} key may only read")
        return self.scope


async def principal_of_key(request: Request, key_hash: str) -> Principal | None:
    """Who the key with this hash is now, or None: unknown, revoked, or a worker key
    (which may use only the worker protocol)."""
    state = api_state(request)
    admin_key = state.settings.admin_key
    if admin_key and hmac.compare_digest(hash_key(admin_key), key_hash):
        return Principal(role="admin", tenant_id=None, key_id=None)
    record = await state.key_cache.lookup(key_hash)
    if record is None or record.revoked_at is not None or record.role == "worker":
        return None
    return Principal(role=record.role, tenant_id=record.tenant_id, key_id=record.id)


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


async def start_session(request: Request, response: Response, key: str) -> Principal:
    """Sign in with ``key``: a new session and its cookie on ``response``. A key that
    is not valid raises :class:`ValidationError` (nothing stored); a worker key
    :class:`PermissionDeniedError`."""
    key = key.strip()
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ValidationError("api_key: enter an API key", field="api_key")
    key_hash = hash_key(key)
    principal = await principal_of_key(request, key_hash)
    if principal is None:
        record = None
        if key.startswith(KEY_PREFIX):
            record = await api_state(request).key_cache.lookup(key_hash)
        if record is not None and record.role == "worker":
            raise PermissionDeniedError("worker keys cannot sign in to the dashboard")
        raise ValidationError("api_key: that API key is not valid", field="api_key")
    state = api_state(request)
    token = secrets.token_urlsafe(32)
    await state.store.ui_sessions_create(
        token_hash=_token_hash(token),
        key_hash=key_hash,
        tenant_id=principal.tenant_id,
        idle=state.settings.ui_session_idle,
        lifetime=state.settings.ui_session_lifetime,
    )
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=int(state.settings.ui_session_lifetime),
        path=COOKIE_PATH,
        secure=_secure(request),
        httponly=True,
        samesite="strict",
    )
    response.delete_cookie(SIGN_IN_COOKIE, path=COOKIE_PATH)
    return principal


async def end_session(request: Request, response: Response, visit: Visit) -> None:
    await api_state(request).store.ui_sessions_delete(token_hash=visit.session.token_hash)
    response.delete_cookie(
        SESSION_COOKIE, path=COOKIE_PATH, secure=_secure(request), httponly=True, samesite="strict"
    )


def sign_in_token(request: Request, response: Response) -> str:
    """The CSRF token of the sign-in form, tied to a cookie of its own (made here when
    the browser has none)."""
    token = request.cookies.get(SIGN_IN_COOKIE)
    if not token or len(token) > _TOKEN_MAX:
        token = secrets.token_urlsafe(32)
        response.set_cookie(
            SIGN_IN_COOKIE,
            token,
            max_age=3600,
            path=COOKIE_PATH,
            secure=_secure(request),
            httponly=True,
            samesite="strict",
        )
    return csrf_of(token)


def check_sign_in_csrf(request: Request, form: Form) -> None:
    token = request.cookies.get(SIGN_IN_COOKIE)
    _check(form, None if not token or len(token) > _TOKEN_MAX else csrf_of(token))


async def signed_in(request: Request) -> Visit:
    """The visit of the browser's session; :class:`SignInRequired` without a live one."""
    token = request.cookies.get(SESSION_COOKIE)
    if not token or len(token) > _TOKEN_MAX:
        raise SignInRequired
    state = api_state(request)
    store = state.store
    now = await store.db_now_estimate()
    session = await store.ui_sessions_get(token_hash=_token_hash(token), now=now)
    if session is None:
        raise SignInRequired("your session has expired: sign in again")
    principal = await principal_of_key(request, session.key_hash)
    if principal is None:
        await store.ui_sessions_delete(token_hash=session.token_hash)
        raise SignInRequired("the API key of your session is no longer valid: sign in again")
    if now - session.last_seen_at >= _TOUCH_EVERY:
        await store.ui_sessions_touch(
            token_hash=session.token_hash,
            idle=state.settings.ui_session_idle,
            lifetime=state.settings.ui_session_lifetime,
            now=now,
        )
    tenant_id = principal.tenant_id if not principal.is_admin else session.tenant_id
    tenant_name = None
    if tenant_id is not None:
        try:
            tenant_name = (await store.tenants_get(tenant_id)).name
        except NotFoundError:
            if not principal.is_admin:
                raise
            # The tenant the admin was looking at was deleted: it chooses another.
            await store.ui_sessions_set_tenant(token_hash=session.token_hash, tenant_id=None)
            tenant_id = None
    visit = Visit(
        principal=principal,
        session=session,
        csrf=csrf_of(token),
        tenant_id=tenant_id,
        tenant_name=tenant_name,
    )
    request.state.visit = visit  # for the error page, which shows the same header
    return visit


class Form(dict[str, list[str]]):
    """A submitted form's fields (``application/x-www-form-urlencoded``)."""

    def one(self, name: str, default: str = "") -> str:
        values = self.get(name)
        return values[0] if values else default


async def read_form(request: Request) -> Form:
    """The form of a POST. Its size is bounded by the app's body limit."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("application/x-www-form-urlencoded", ""):
        raise ValidationError(f"a form is expected, not {kind}", field="content-type")
    body = (await request.body()).decode("utf-8", errors="replace")
    try:
        fields = parse_qs(body, keep_blank_values=True, max_num_fields=_FORM_MAX_FIELDS)
    except ValueError:
        raise ValidationError("the form has too many fields") from None
    return Form(fields)


def _check(form: Form, expected: str | None) -> None:
    given = form.one("csrf")
    if expected is None or not given or not hmac.compare_digest(given, expected):
        raise PermissionDeniedError("the form's CSRF token is missing or wrong: reload the page")


async def checked_form(request: Request, visit: Visit) -> Form:
    """The POSTed form, its CSRF token checked against the session's (403 else)."""
    form = await read_form(request)
    _check(form, visit.csrf)
    return form
