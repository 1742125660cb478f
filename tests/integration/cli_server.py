"""A running server for the CLI tests: ``cronwheel`` commands run against it in
process, as users run them (the URL and key in the environment)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from click.testing import Result
from typer.testing import CliRunner

from cronwheel.cli import app

__all__ = ["CLI_ADMIN_KEY", "Server"]

CLI_ADMIN_KEY = "cli-admin-key"


@dataclass
class Server:
    """A running server (API + scheduler on a free port, on its own thread), a tenant
    made on it, and ``cronwheel`` commands against it."""

    url: str
    operator_key: str
    tenant_id: str
    runner: CliRunner

    def cli(
        self, *args: str, key: str | None = None, input: str | None = None, **env: str
    ) -> Result:
        """``cronwheel <args>`` with the URL and key in the environment, as users set them;
        ``input`` is what the user types."""
        environ = {
            "CRONWHEEL_URL": self.url,
            "CRONWHEEL_API_KEY": key or self.operator_key,
            "COLUMNS": "200",
            **env,
        }
        return self.runner.invoke(app, list(args), env=environ, input=input)

    def json(self, *args: str, key: str | None = None) -> Any:
        result = self.cli(*args, "--json", key=key)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)
