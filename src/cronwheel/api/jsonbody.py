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
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar, get_args, get_origin

from fastapi import HTTPException, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from cronwheel.domain.bounds import JSON_DEPTH_MAX, check_json_tree, unstorable
from cronwheel.domain.errors import CronwheelError, ValidationError
from cronwheel.jsontext import KeyTwiceError, loads_fast, member_dropped, pairs_once

__all__ = [
    "MISSING",
    "InvalidJsonError",
    "Solver",
    "StrictJsonRoute",
    "loads_strict",
    "request_body",
    "solved_by",
    "validated",
]

# What a route's parameters are solved from, by hand: the request and its body as
# :func:`request_body` reads it; the endpoint's keyword arguments (see ``solved_by``).
Solver = Callable[[Request, Any], Awaitable[dict[str, Any]]]
_SOLVERS: dict[Callable[..., Any], Solver] = {}


class _Missing:
    """No body, or no value: what FastAPI calls ``Undefined``."""


MISSING: Any = _Missing()


EndpointT = TypeVar("EndpointT", bound=Callable[..., Any])


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
_ONE_BRACKET = bytes.maketrans(b"[]", b"{}")
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
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    plain = body.translate(None, _NOT_SKELETON)
    # A string without brackets is two quotes in a row: dropped in one pass. A quote
    # left means a string holds a bracket: then each one's inside is dropped (splitting
    # at every quote costs ten times more).
    skeleton = plain.replace(b'""', b"")
    if b'"' in skeleton:
        skeleton = b"".join(plain.split(b'"')[::2])
    # Arrays and objects nest alike (the body is JSON: each bracket is matched).
    skeleton = skeleton.translate(_ONE_BRACKET)
    for _ in range(limit):
        # One pass strips the pairs innermost now: exactly one level a round.
        skeleton = skeleton.replace(b"{}", b"")
        if not skeleton:
            return False
    return True


def _key_twice(body: bytes) -> ValidationError:
    """The refusal of a body that gives a key twice in one object (read, one of the
    values would be dropped: never what the client meant), naming the key."""
    try:
        json.loads(body, object_pairs_hook=pairs_once)
    except KeyTwiceError as exc:
        return _ambiguous(exc)
    return ValidationError("the request body is ambiguous: it gives a key twice in one object")


def _ambiguous(exc: KeyTwiceError) -> ValidationError:
    return ValidationError(f"the request body is ambiguous: {exc}")


def loads_strict(body: bytes) -> Any:
    """Parse ``body`` as strict JSON and check it against the bounds."""
    value = loads_fast(body, MISSING)
    if value is not MISSING:
        if _suspect(body) or _deeper_than(body, JSON_DEPTH_MAX):
            check_json_tree(value)  # first: nothing deeper than the bound is written back
        if member_dropped(body, value):
            raise _key_twice(body)
        return value
    infinite: list[str] = []

    def finite(text: str) -> float:
        value = float(text)
        if math.isinf(value):
            infinite.append(text)
        return value

    try:
        value = json.loads(
            body,
            parse_constant=_refuse_constant,
            parse_float=finite,
            object_pairs_hook=pairs_once,
        )
    except KeyTwiceError as exc:
        raise _ambiguous(exc) from None
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


def _check_query(request: Request, known: Mapping[str, bool]) -> None:
    given: set[str] = set()
    for name, value in request.query_params.multi_items():
        problem = unstorable(value) or unstorable(name)
        if problem is not None:
            raise ValidationError(f"{name}: {problem}", field=name)
        if name not in known:
            # Taken and ignored, a misspelt filter would answer everything unfiltered.
            hint = f"; this route takes {', '.join(sorted(known))}" if known else ""
            raise ValidationError(f"{name}: not a query parameter of this route{hint}", field=name)
        if name in given and not known[name]:
            # All but the last would be dropped: ?force=false&force=true deleted.
            raise ValidationError(f"{name}: given more than once; it takes one value", field=name)
        given.add(name)


def _dependants(dependant: Dependant) -> Iterator[Dependant]:
    """A route's dependant and its dependencies', all the way down."""
    yield dependant
    for sub in dependant.dependencies:
        yield from _dependants(sub)


def _query_names(dependant: Dependant) -> dict[str, bool]:
    """The query parameters a route declares, its dependencies' included, each with
    whether it takes several values (a list)."""
    return {
        getattr(f, "validation_alias", None) or f.alias: _many(f.field_info.annotation)
        for d in _dependants(dependant)
        for f in d.query_params
    }


_IDEMPOTENCY_KEY = "idempotency-key"


def _header_names(dependant: Dependant) -> set[str]:
    """The headers a route declares (lower case), its dependencies' included."""
    return {f.alias.lower() for d in _dependants(dependant) for f in d.header_params}


def _many(annotation: Any) -> bool:
    """Whether a parameter so annotated takes several values (``list[str] | None``)."""
    if get_origin(annotation) in (list, tuple, set, frozenset):
        return True
    return any(_many(arg) for arg in get_args(annotation) if arg is not type(None))


def _no_body(body: bytes) -> bool:
    """A body that says nothing: none, or an empty object or null."""
    return body.strip() in (b"", b"{}", b"null")


def solved_by(solve: Solver) -> Callable[[EndpointT], EndpointT]:
    """Serve the decorated endpoint with the keyword arguments ``solve`` makes from the
    request and its body, instead of FastAPI's dependency solving — a third of a single
    job creation's time in this process. The endpoint's signature still describes the
    route (the OpenAPI schema) and ``solve`` must take its parameters as FastAPI would:
    sub-dependencies first (their errors raised as they are), then headers and the body
    (:func:`validated`), all their errors in one ``RequestValidationError``. The
    endpoint must answer a ``Response``. For the hottest routes only."""

    def mark(endpoint: EndpointT) -> EndpointT:
        _SOLVERS[endpoint] = solve
        return endpoint

    return mark


async def request_body(request: Request) -> Any:
    """The body as FastAPI hands it to validation: the JSON (strict) when the content
    type says JSON, the bytes otherwise, :data:`MISSING` when there is none; malformed
    JSON is FastAPI's ``json_invalid`` error."""
    try:
        raw = await request.body()
    except Exception as exc:
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from exc
    if not raw:
        return MISSING
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if not media or not _is_json(media):
        return raw  # FastAPI's strict content type: no type given is not JSON
    try:
        return await request.json()
    except json.JSONDecodeError as exc:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", exc.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": exc.msg},
                }
            ],
            body=exc.doc,
        ) from exc


def validated(
    adapter: TypeAdapter[Any], value: Any, loc: tuple[str, ...], *, required: bool = True
) -> tuple[Any, list[dict[str, Any]]]:
    """``value`` validated as FastAPI validates a parameter (``from_attributes``, each
    error's location under ``loc``): the value and no errors, or None and the errors.
    :data:`MISSING` is an error when ``required``, None otherwise."""
    if value is MISSING:
        if required:
            return None, [{"type": "missing", "loc": loc, "msg": "Field required", "input": None}]
        return None, []
    try:
        return adapter.validate_python(value, from_attributes=True), []
    except PydanticValidationError as exc:
        return None, [{**e, "loc": loc + tuple(e["loc"])} for e in exc.errors(include_url=False)]


class StrictJsonRoute(APIRoute):
    """The route class of every router: strict JSON bodies, storable query values, and
    nothing the route would drop (422 naming it): a query parameter it does not declare,
    one of one value given twice, a body where it takes none, an ``Idempotency-Key``
    where it takes none."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        solve = _SOLVERS.get(self.endpoint)
        handler = super().get_route_handler() if solve is None else _direct(self.endpoint, solve)

        has_body = self.body_field is not None
        known = _query_names(self.dependant)
        keyed = _IDEMPOTENCY_KEY in _header_names(self.dependant)

        async def strict(request: Request) -> Response:
            if request.scope.get("query_string"):
                _check_query(request, known)
            if not keyed and _IDEMPOTENCY_KEY in request.headers:
                # A client retrying under it would believe the retry safe.
                raise ValidationError(
                    "Idempotency-Key: this route takes none; a retry of it is not made safe",
                    field="Idempotency-Key",
                )
            strict_request = _StrictRequest(request.scope, request.receive)
            if not has_body:
                # A route that takes no body would drop what one says (a reason sent
                # with a DELETE would never reach the audit trail).
                if not _no_body(await strict_request.body()):
                    raise ValidationError(
                        "this route takes no request body: its options go in the query"
                    )
            # Parsed here, not in FastAPI's body reading, which turns any error but a
            # JSONDecodeError into a bare 400: ours name the field.
            elif _is_json(request.headers.get("content-type")):
                body = await strict_request.body()
                if body:
                    # Not JSON at all: FastAPI parses it again and answers its own 400.
                    with contextlib.suppress(json.JSONDecodeError):
                        strict_request._json = loads_strict(body)
            return await handler(strict_request)

        return strict


def _direct(
    endpoint: Callable[..., Any], solve: Solver
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    async def direct(request: Request) -> Response:
        values = await solve(request, await request_body(request))
        answer = await endpoint(request=request, **values)
        assert isinstance(answer, Response)
        return answer

    return direct
