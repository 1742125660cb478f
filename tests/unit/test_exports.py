"""Every public module says what it exports: each name in ``__all__`` exists, and each
public name it defines is in ``__all__``."""

from __future__ import annotations

import ast
import importlib
import logging
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import pytest

import cronwheel

# Parts still being written; add them here no longer once they land.
IN_PROGRESS: tuple[str, ...] = ()
# The dashboard's page modules, whose handlers are routes like the API's.
UI_PAGES = frozenset(
    f"cronwheel.ui.{m}" for m in ("fleet", "jobs", "overview", "runs", "signin", "workflows")
)
# Not importable modules but files Alembic loads by path.
NOT_MODULES = ("cronwheel.store.migrations",)


def _skipped(name: str) -> bool:
    if name.endswith(".__main__"):  # runs the program when imported
        return True
    return any(name == p or name.startswith((f"{p}.", f"{p}_")) for p in IN_PROGRESS + NOT_MODULES)


def _module_names() -> list[str]:
    names = ["cronwheel"]
    packages = [cronwheel]
    while packages:
        package = packages.pop()
        for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
            if _skipped(info.name):
                continue
            names.append(info.name)
            if info.ispkg:
                packages.append(importlib.import_module(info.name))
    return sorted(names)


MODULES = _module_names()


def _defined_public_names(module: ModuleType) -> set[str]:
    """Names bound at the top level of the module's own source (imports excluded)."""
    assert module.__file__ is not None
    source = Path(module.__file__).read_text(encoding="utf-8")
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    # Loggers and type variables are plumbing, not part of what a module offers.
    plumbing = (logging.Logger, TypeVar)
    return {
        n
        for n in names
        if not n.startswith("_") and not isinstance(getattr(module, n, None), plumbing)
    }


def test_the_public_modules_are_found() -> None:
    for expected in ("cronwheel.domain.states", "cronwheel.store.base", "cronwheel.timing"):
        assert expected in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_every_exported_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(getattr(module, "__all__", []))
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what it does not have"


@pytest.mark.parametrize("name", MODULES)
def test_every_public_name_is_exported(name: str) -> None:
    if name.startswith("cronwheel.api.routers.") or name in UI_PAGES:
        pytest.skip("route handlers are registered on a router, not imported by name")
    module = importlib.import_module(name)
    exported = set(getattr(module, "__all__", []))
    unexported = sorted(_defined_public_names(module) - exported)
    assert unexported == [], (
        f"{name} defines public names missing from __all__: {', '.join(unexported)} "
        "(export them or prefix them with _)"
    )
