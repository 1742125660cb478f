"""What ``cronwheel`` commands print and how they fail: their help, the consoles, tables,
JSON, instants, logging, and the errors a user can cause as a red line and an exit
code."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NoReturn

import typer
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import to_jsonable_python
from rich.console import Console, ConsoleDimensions
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from cronwheel.client import ApiError
from cronwheel.domain.errors import CronwheelError

__all__ = [
    "PIPE_WIDTH",
    "command_group",
    "console",
    "count",
    "err",
    "fail",
    "handle_errors",
    "key_values",
    "print_json",
    "setup_logging",
    "short_time",
    "table",
]

# How wide output is when it goes to a pipe or a file (and COLUMNS does not say): wide
# enough that no table folds a cell, so each row stays one line for grep and awk.
PIPE_WIDTH = 10_000


class _Console(Console):
    """A console as wide as the terminal it writes to, or :data:`PIPE_WIDTH` when it
    writes to something else (a terminal on stdin or stderr does not count: Rich would
    take its width), unless COLUMNS says otherwise."""

    @property
    def size(self) -> ConsoleDimensions:
        measured = super().size
        if self._width is None and not self.is_terminal and "COLUMNS" not in self._environ:
            return ConsoleDimensions(PIPE_WIDTH, measured.height)
        return measured

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


console = _Console(soft_wrap=True)  # keys and ids must stay on one line to be copied
# Messages and log lines: as wide as a terminal (log lines fill the width they get).
err = Console(stderr=True, soft_wrap=True)


def command_group(help: str, **options: Any) -> typer.Typer:
    """A group of commands. Every group's help (and the root's) is rendered as Markdown:
    paragraphs flow to the terminal's width instead of breaking where the source line
    did, and brackets in help texts are text, not Rich markup (which would swallow
    them). Defaults are declared with ``show_default``, never written into the help."""
    return typer.Typer(
        help=help,
        no_args_is_help=True,
        rich_markup_mode="markdown",
        context_settings={"help_option_names": ["-h", "--help"]},
        **options,
    )


def fail(message: str, *, code: int = 1) -> NoReturn:
    """A red message on stderr and a non-zero exit."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def _validation_message(exc: PydanticValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        parts.append(f"{where}: {error['msg']}" if where else str(error["msg"]))
    return "; ".join(parts)


@contextmanager
def handle_errors() -> Iterator[None]:
    """Turn the errors a user can cause into a clear message and exit code 1."""
    try:
        yield
    except ApiError as exc:
        hint = ""
        if exc.code == "tenant_required":
            # The server names its HTTP header; here the user names the tenant otherwise.
            fail(
                "the admin key acts on a tenant's jobs and runs only for a tenant named "
                "with --tenant TENANT_ID (or CRONWHEEL_TENANT)",
                code=2,
            )
        if exc.code == "in_use":
            hint = " — --force ends what is in progress"
        elif exc.code == "precondition_failed":
            hint = " — it changed since it was read: look again, then run the command again"
        elif exc.status == 401:
            hint = " — check --api-key / CRONWHEEL_API_KEY"
        elif exc.status == 0:
            hint = " — is the server running? check --url / CRONWHEEL_URL"
        where = f" (field {exc.field})" if exc.field else ""
        fail(f"{exc.message}{where} [{exc.code}]{hint}")
    except PydanticValidationError as exc:
        fail(f"invalid configuration: {_validation_message(exc)}")
    except CronwheelError as exc:
        fail(exc.message)
    except (ValueError, OSError) as exc:
        fail(str(exc))


def count(number: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def print_json(value: Any) -> None:
    console.print_json(json.dumps(to_jsonable_python(value)), highlight=False)


def short_time(value: Any) -> str:
    """An API instant as ``YYYY-MM-DD HH:MM:SS.mmmZ`` (full precision stays in --json)."""
    if not value:
        return ""
    try:
        instant = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    return instant.strftime("%Y-%m-%d %H:%M:%S.") + f"{instant.microsecond // 1000:03d}Z"


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    caption: str | None = None,
) -> Table:
    out = Table(title=title, caption=caption, header_style="bold", expand=False)
    for name in columns:
        # ids must stay whole to be copied: fold rather than truncate
        out.add_column(name, overflow="fold")
    for row in rows:
        out.add_row(*("" if v is None else escape(str(v)) for v in row))
    return out


def key_values(title: str, values: Mapping[str, Any]) -> Table:
    out = Table(title=title, show_header=False, expand=False)
    out.add_column("field", style="bold")
    out.add_column("value", overflow="fold")
    for key, value in values.items():
        if value is None or value == [] or value == {}:
            continue
        shown = json.dumps(value) if isinstance(value, dict | list) else str(value)
        out.add_row(key, escape(shown))
    return out


def setup_logging(level: str) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        fail(f"--log-level: unknown level {level!r}", code=2)
    handler = RichHandler(
        console=err,
        show_path=False,
        rich_tracebacks=False,
        markup=False,
        log_time_format="%H:%M:%S",
    )
    logging.basicConfig(level=numeric, handlers=[handler], format="%(message)s", force=True)
    if numeric > logging.DEBUG:
        # Migrations narrate every step at INFO; that is debugging detail here.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request
