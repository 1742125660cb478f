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
import math
import re
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


# What can hide a string no backend stores: a NUL or a surrogate escape, or a
# surrogate's own UTF-8 bytes (which ``json`` lets through). Only a body holding one of
# these is walked in full; the rest is refused or passed on its bracket skeleton alone.
# (Each is looked for with a plain substring search first: a regular expression over a
# whole body costs a millisecond per 80 KB.)
_ESCAPE = re.compile(rb"\\u0000|\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")
_PAIR = re.compile(rb"\{\}|\[\]")
_NOT_SKELETON = bytes(b for b in range(256) if b not in b'[]{}"')


def _suspect(body: bytes) -> bool:
    return (b"\\u" in body and _ESCAPE.search(body) is not None) or (
        b"\xed" in body and _SURROGATE.search(body) is not None
    )


def _deeper_than(body: bytes, limit: int) -> bool:
    """Whether ``body`` (valid JSON) nests deeper than ``limit``, from its brackets
    outside strings alone, with C-speed passes over the bytes."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    # Escapes first (an escaped quote is no quote), then only brackets and quotes are
    # kept, and what lies between quotes (inside strings) is dropped.
    plain = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_SKELETON)
    skeleton = b"".join(plain.split(b'"')[::2])
    for _ in range(limit):
        # One pass strips the pairs innermost now: exactly one level a round.
        skeleton = _PAIR.sub(b"", skeleton)
        if not skeleton:
            return False
    return True


def loads_strict(body: bytes) -> Any:
    """Parse ``body`` as strict JSON and check it against the bounds."""
    infinite: list[str] = []

    def finite(text: str) -> float:
        value = float(text)
        if math.isinf(value):
            infinite.append(text)
        return value

    try:
        value = json.loads(body, parse_constant=_refuse_constant, parse_float=finite)
    except RecursionError:
        raise ValidationError(
            f"the request body is nested deeper than {JSON_DEPTH_MAX} levels"
        ) from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # an integer of more digits than Python converts
        raise InvalidJsonError(f"the request body is not valid JSON: {exc}") from None
    if infinite or _suspect(body) or _deeper_than(body, JSON_DEPTH_MAX):
        check_json_tree(value)  # finds the place, and everything the skeleton cannot
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
