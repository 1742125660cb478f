"""The client turns every kind of error answer into an ApiError with a stable code, and
builds requests that cannot escape their route."""

from __future__ import annotations

import socket

import httpx
import pytest

from cronwheel import ApiConnectionError, ApiError, AsyncClient, Client
from cronwheel.client import Call, error_from_response
from cronwheel.client.calls import Calls
from cronwheel.domain.errors import CronwheelError


def _response(status: int, **kwargs: object) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", "http://x/v1/jobs"), **kwargs)


def test_api_error_body_keeps_code_message_and_field() -> None:
    exc = error_from_response(
        _response(
            422,
            json={
                "error": {
                    "code": "invalid_schedule",
                    "message": "'at' is in the past",
                    "field": "schedule.at",
                    "details": {"limit": 300},
                }
            },
        )
    )
    assert (exc.status, exc.code, exc.message, exc.field) == (
        422,
        "invalid_schedule",
        "'at' is in the past",
        "schedule.at",
    )
    assert exc.details == {"limit": 300}
    assert isinstance(exc, CronwheelError)
    assert "schedule.at" in str(exc) and "422 invalid_schedule" in str(exc)


def test_framework_validation_detail_names_the_field() -> None:
    exc = error_from_response(
        _response(
            422,
            json={
                "detail": [
                    {"loc": ["body", "retry", "max_attempts"], "msg": "must be >= 1", "type": "x"}
                ]
            },
        )
    )
    assert (exc.code, exc.field, exc.message) == (
        "invalid_request",
        "retry.max_attempts",
        "must be >= 1",
    )


def test_detail_string_and_foreign_pages_get_an_http_code() -> None:
    exc = error_from_response(_response(404, json={"detail": "Not Found"}))
    assert (exc.status, exc.code, exc.message) == (404, "http_404", "Not Found")

    page = "<html><body><h1>502 Bad Gateway</h1>\n\n<p>nginx</p></body></html>"
    exc = error_from_response(_response(502, text=page))
    assert exc.status == 502 and exc.code == "http_502"
    assert exc.message.startswith("Bad Gateway: <html>") and "\n" not in exc.message

    exc = error_from_response(_response(503))
    assert (exc.code, exc.message) == ("http_503", "Service Unavailable")


def test_ids_cannot_climb_out_of_their_route() -> None:
    call = Calls.jobs_get("../tenants")
    assert call.path == "/v1/jobs/..%2Ftenants"
    assert Calls.runs_cancel("a/b?c", None).path == "/v1/runs/a%2Fb%3Fc/cancel"


@pytest.mark.parametrize("ident", ["", ".", "..", "..."])
def test_an_empty_or_dots_only_id_is_refused_before_any_request(ident: str) -> None:
    # The path would lose it (GET /v1/workflows/ is the list) or climb by it.
    with pytest.raises(ValueError, match="names nothing here"):
        Calls.workflows_get(ident)
    with pytest.raises(ValueError, match="names nothing here"):
        Calls.jobs_delete(ident, False, None)
    assert Calls.workflows_get("a.b").path == "/v1/workflows/a.b"


def test_a_redirect_is_an_error_not_an_empty_answer() -> None:
    answer = httpx.Response(
        307,
        headers={"location": "http://x/v1/workflows"},
        request=httpx.Request("DELETE", "http://x/v1/workflows/"),
    )
    with pytest.raises(ApiError) as caught:
        Client._parse(answer)
    assert (caught.value.status, caught.value.code) == (307, "bad_response")
    assert "DELETE /v1/workflows/ names no resource" in caught.value.message


def test_list_filters_skip_none_and_join_many_states() -> None:
    call = Calls.runs_list(None, ["FAILED", "DEAD_LETTER"], None, None, None, None, 10)
    assert call.params == {"state": "FAILED,DEAD_LETTER", "limit": "10"}


def test_job_body_carries_extra_fields_and_the_idempotency_header() -> None:
    call = Calls.jobs_create(
        "n", {"delay": 5}, "t", "key-1", {"payload": {"a": 1}, "pool": None, "priority": 0}
    )
    assert call == Call(
        "POST",
        "/v1/jobs",
        json={
            "name": "n",
            "schedule": {"delay": 5},
            "task": "t",
            "payload": {"a": 1},
            "priority": 0,
        },
        headers={"Idempotency-Key": "key-1"},
    )


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://host", "http://", "not a url"])
def test_a_bad_url_is_refused_at_once(url: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        Client(url, api_key="k")
    with pytest.raises(ValueError, match="URL"):
        AsyncClient(url, api_key="k")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_unreachable_server_is_a_connection_error() -> None:
    client = Client(f"http://127.0.0.1:{_closed_port()}", api_key="k", timeout=5)
    with client, pytest.raises(ApiConnectionError) as info:
        client.jobs.list()
    assert info.value.status == 0 and info.value.code == "connection_error"
    assert isinstance(info.value, ConnectionError) and isinstance(info.value, ApiError)
    assert "cannot reach http://127.0.0.1:" in info.value.message


async def test_unreachable_server_is_a_connection_error_async() -> None:
    async with AsyncClient(f"http://127.0.0.1:{_closed_port()}", api_key="k") as client:
        with pytest.raises(ApiConnectionError):
            await client.runs.get("x")


def test_a_412_is_a_precondition_failure_naming_the_current_version() -> None:
    from cronwheel import PreconditionFailedError

    body = {
        "error": {
            "code": "precondition_failed",
            "message": "job j is at version 4, not 3",
            "details": {"current_version": 4},
        }
    }
    exc = error_from_response(_response(412, json=body))
    assert isinstance(exc, PreconditionFailedError) and isinstance(exc, ApiError)
    assert (exc.status, exc.code, exc.current_version) == (412, "precondition_failed", 4)
    # Not ours (a proxy's page): an ApiError all the same, no version to name.
    other = error_from_response(_response(412, text="<html>precondition</html>"))
    assert not isinstance(other, PreconditionFailedError) and other.status == 412


def test_an_edit_names_its_version_and_sends_null_as_a_value() -> None:
    call = Calls.jobs_update("j/1", {"payload": {"a": 1}, "tags": None}, 3, "why")
    assert (call.method, call.path) == ("PATCH", "/v1/jobs/j%2F1")
    assert call.json == {"payload": {"a": 1}, "tags": None, "reason": "why"}
    assert call.headers == {"If-Match": '"3"'}
    assert Calls.jobs_update("j", {"pool": "p"}, None, None).headers == {}
