"""What both clients share and that needs no I/O: the credentials, the headers, and
reading answers (an error answer becomes an :class:`ApiError`)."""

from __future__ import annotations

from typing import Any

import httpx

from cronwheel import jsontext
from cronwheel.client.calls import Call, Id, Json
from cronwheel.client.errors import ApiConnectionError, ApiError, error_from_response
from cronwheel.domain.model import Page

__all__ = [
    "DEFAULT_TIMEOUT",
    "TENANT_HEADER",
    "BaseClient",
    "read_items",
    "read_lines",
    "read_page",
]

DEFAULT_TIMEOUT = 30.0
TENANT_HEADER = "Cronwheel-Tenant"


def read_page(data: Any) -> Page[Json]:
    """A list answer as a :class:`Page`; ``bad_response`` when it is none."""
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise ApiError(200, "bad_response", "the server answered a list without 'items'")
    return Page(items=list(data["items"]), next_cursor=data.get("next_cursor"))


def read_lines(page: Any) -> list[Json]:
    """The lines of a logs answer; ``bad_response`` when it has none."""
    if not isinstance(page, dict) or not isinstance(page.get("lines"), list):
        raise ApiError(200, "bad_response", "the server answered logs without 'lines'")
    return list(page["lines"])


def read_items(data: Any) -> list[Json]:
    """The items of an answer that is not paged; ``bad_response`` when it has none."""
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise ApiError(200, "bad_response", "the server answered a list without 'items'")
    return list(data["items"])


class BaseClient:
    """What both clients share: the base URL, the credentials, request building and
    error parsing. No I/O happens here."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        tenant: Id | None = None,
    ) -> None:
        self.url = self._validate_url(url)
        self.api_key = api_key
        self.timeout = timeout
        self.tenant = None if tenant is None else str(tenant)

    @staticmethod
    def _validate_url(url: str) -> str:
        """The base URL without its trailing slash; ValueError unless it is http(s)."""
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a valid URL: {url!r} ({exc})") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"not an http(s) URL: {url!r} (expected http://host:port)")
        return str(parsed).rstrip("/")

    def _default_headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "cronwheel-python"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _headers_for(self, call: Call) -> dict[str, str]:
        headers = dict(call.headers)
        if self.tenant is not None:
            headers[TENANT_HEADER] = self.tenant
        return headers

    def _transport_error(self, exc: httpx.TransportError, call: Call) -> ApiConnectionError:
        if isinstance(exc, httpx.TimeoutException):
            return ApiConnectionError(
                f"{call.method} {self.url}{call.path} timed out after {self.timeout:g} s",
                code="timeout",
            )
        return ApiConnectionError(f"cannot reach {self.url}: {exc or type(exc).__name__}")

    @staticmethod
    def _parse(response: httpx.Response) -> Any:
        if response.is_error:
            raise error_from_response(response)
        if response.is_redirect:
            # No route of the API redirects: the path named no resource of it.
            raise ApiError(
                response.status_code,
                "bad_response",
                f"{response.request.method} {response.request.url.path} names no resource "
                f"of the API (the server redirects it)",
            )
        if response.status_code == 204 or not response.content:
            return None
        try:
            return jsontext.loads(response.content)
        except ValueError as exc:
            raise ApiError(
                response.status_code, "bad_response", "the server answered something not JSON"
            ) from exc
