"""The options the API commands share — where the API is, the key, the tenant,
``--json``, ``--reason`` — the :class:`~cronwheel.client.Client` they make, and the
parsing of instants and JSON objects given as options."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer

from cronwheel.cli.output import fail
from cronwheel.client import Client
from cronwheel.jsontext import pairs_once

__all__ = [
    "DEFAULT_URL",
    "ApiKeyOpt",
    "CursorOpt",
    "JsonOpt",
    "ReasonOpt",
    "TenantOpt",
    "UrlOpt",
    "client_for",
    "parse_instant",
    "parse_json_object",
]

DEFAULT_URL = "http://127.0.0.1:8000"

UrlOpt = Annotated[
    str, typer.Option("--url", envvar="CRONWHEEL_URL", help="The cronwheel API.", show_default=True)
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="CRONWHEEL_API_KEY",
        show_default=False,
        help="An API key (operator or viewer; the admin key needs --tenant).",
    ),
]
TenantOpt = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        envvar="CRONWHEEL_TENANT",
        show_default=False,
        help="The tenant id an admin key acts for.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
ReasonOpt = Annotated[
    str | None,
    typer.Option("--reason", help="Recorded in the history (the audit trail).", show_default=False),
]
CursorOpt = Annotated[
    str | None,
    typer.Option("--cursor", help="next_cursor of a previous page.", show_default=False),
]


def client_for(url: str, api_key: str | None, tenant: str | None) -> Client:
    if not api_key:
        fail("no API key: pass --api-key or set CRONWHEEL_API_KEY", code=2)
    try:
        return Client(url, api_key=api_key, tenant=tenant)
    except ValueError as exc:
        fail(f"--url: {exc}", code=2)


def parse_instant(value: str, option: str) -> datetime:
    """An ISO-8601 instant with an offset (``Z`` for UTC), or a usage error naming
    ``option``."""
    try:
        instant = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not an ISO-8601 instant (e.g. 2030-01-31T09:00:00+01:00 or "
            "2030-01-31T08:00:00Z)",
            param_hint=f"'{option}'",
        ) from None
    if instant.tzinfo is None:
        raise typer.BadParameter(
            f"{value!r} has no UTC offset: add one (e.g. +01:00) or Z for UTC",
            param_hint=f"'{option}'",
        )
    return instant


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a number in JSON")


def parse_json_object(value: str, option: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value, object_pairs_hook=pairs_once, parse_constant=_not_json)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(
            f"not valid JSON: {exc.msg} (at char {exc.pos})", param_hint=f"'{option}'"
        ) from None
    except ValueError as exc:  # NaN, Infinity; a key given twice
        raise typer.BadParameter(f"not valid JSON: {exc}", param_hint=f"'{option}'") from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter(
            'must be a JSON object, e.g. \'{"region": "us"}\'', param_hint=f"'{option}'"
        )
    return parsed
