"""Strict input: every route parses its JSON body and reads its query through here.

Python's ``json`` accepts ``NaN`` and ``Infinity``, which are not JSON: one backend
stored them as null, the other failed. It decodes ``\\u0000`` and unpaired surrogates,
which PostgreSQL cannot store, and recurses without bound. So each body is parsed
strictly and walked once (``domain.bounds.check_json_tree``) before any model sees
it, and each query value is checked for characters no backend stores. A failure is a
4xx naming the place, and nothing has been touched.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from cronwheel.domain.bounds import JSON_DEPTH_MAX, check_json_tree, unstorable
from cronwheel.domain.errors import CronwheelError, ValidationError

__all__ = ["InvalidJsonError", "StrictJsonRoute", "loads_strict"]


class InvalidJsonError(CronwheelError):
    """The body is not JSON (or uses Python's extensions of it)."""

    status = 400
    code = "invalid_json"


def _refuse_constant(name: str) -> Any:
    raise InvalidJsonError(
        f"the request body is not valid JSON: {name} is not a JSON value (numbers must be finite)"
    )


def loads_strict(body: bytes) -> Any:
    """Parse ``body`` as strict JSON and check it against the bounds."""
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValidationError(
            f"the request body is nested deeper than {JSON_DEPTH_MAX} levels"
        ) from None
    check_json_tree(value)
    return value


class _StrictRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_strict(await self.body())
        return self._json


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI will read the body as JSON (no type given, or a JSON type)."""
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _check_query(request: Request) -> None:
    for name, value in request.query_params.multi_items():
        problem = unstorable(value) or unstorable(name)
        if problem is not None:
            raise ValidationError(f"{name}: {problem}", field=name)


class StrictJsonRoute(APIRoute):
    """The route class of every router: strict JSON bodies, storable query values."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        has_body = self.body_field is not None

        async def strict(request: Request) -> Response:
            if request.scope.get("query_string"):
                _check_query(request)
            strict_request = _StrictRequest(request.scope, request.receive)
            # Parsed here, not in FastAPI's body reading, which turns any error but a
            # JSONDecodeError into a bare 400: ours name the field.
            if has_body and _is_json(request.headers.get("content-type")):
                body = await strict_request.body()
                if body:
                    # Not JSON at all: FastAPI parses it again and answers its own 400.
                    with contextlib.suppress(json.JSONDecodeError):
                        strict_request._json = loads_strict(body)
            return await handler(strict_request)

        return strict
