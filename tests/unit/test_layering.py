"""The layering, written down once: no role imports another role, and the shared code imports
no role. The shared code, from the bottom up: ``ipc`` (the contracts between processes),
``configs`` (settings and the model-config schema) and ``dataplane`` (how any process sends
inference requests through the broker: the frontend's adapters and business logic scripting
in a worker); each imports only those below it. Read from every module's imports (AST), so a
new arrow fails here before anyone runs it.

The roles are the processes: ``frontend``, ``broker``, ``workers``, and ``shoal`` (the
command line and the launcher). ``KNOWN`` lists the arrows that exist against these rules,
each to be removed by moving code; an arrow that is gone must leave the list too, so the
list only shrinks (it is empty now: keep it so).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("frontend", "broker", "workers", "shoal")
SHARED = ("ipc", "configs", "dataplane")
#: The shared packages from the bottom up: each may import only those below it.
_LEVEL = {name: i for i, name in enumerate(SHARED)}

#: (importing file, imported module) pairs that break the rules today.
KNOWN: frozenset[tuple[str, str]] = frozenset({})


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from pkg import mod`: the module itself, when it is one
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _arrows() -> set[tuple[str, str]]:
    arrows: set[tuple[str, str]] = set()
    for package in (*ROLES, *SHARED):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for module in _imports(path):
                top = module.split(".")[0]
                if top == package or top not in (*ROLES, *SHARED):
                    continue
                if top in ROLES and (package in ROLES or package in SHARED):
                    exists = (ROOT / module.replace(".", "/")).with_suffix(".py").exists()
                    if exists or (ROOT / module.replace(".", "/")).is_dir():
                        arrows.add((rel, module))
                elif package in SHARED and _LEVEL[top] > _LEVEL[package]:
                    arrows.add((rel, module))
    return arrows


def test_no_role_imports_another_and_shared_code_imports_no_role() -> None:
    new = sorted(_arrows() - KNOWN)
    assert not new, f"imports across the layers (see this module's docstring): {new}"


def test_the_known_exceptions_are_still_there() -> None:
    gone = sorted(KNOWN - _arrows())
    assert not gone, f"no longer imported: remove from KNOWN: {gone}"
