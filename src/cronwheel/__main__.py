"""``python -m cronwheel`` runs the CLI."""

from __future__ import annotations

from cronwheel.cli import main

main()
