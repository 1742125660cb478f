"""``python -m cronwheel.cli`` runs the CLI, as ``python -m cronwheel`` does."""

from __future__ import annotations

from cronwheel.cli import main

main()
