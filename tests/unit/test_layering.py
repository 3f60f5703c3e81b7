"""The layering, written down once: no role imports another role, and the shared code imports
no role. The shared code, from the bottom up: ``ipc`` (the contracts between processes),
``configs`` (settings and the model-config schema) and ``dataplane`` (how any process sends
inference requests through the broker: the frontend's adapters and business logic scripting
in a worker); each imports only those below it. Read from every module's imports (AST), so a
new arrow fails here before anyone runs it.

The roles are the processes: ``shoal.frontend``, ``shoal.broker``, ``shoal.workers``, and the
launcher (``shoal``'s own modules: the command line and the launcher). The shared packages are
``shoal.ipc``, ``shoal.configs`` and ``shoal.dataplane``. ``KNOWN`` lists the arrows that exist
against these rules, each to be removed by moving code; an arrow that is gone must leave the
list too, so the list only shrinks (it is empty now: keep it so).

``shoal.analyze`` is a client tool (``shoal analyze``): it starts a server as a child
process and talks to it through the public API, as Model Analyzer drives tritonserver. It
may import the shared ``ipc`` and ``configs`` (the config validator), never a role nor the
data plane; the launcher's command line may import it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: ``launcher``: shoal's own modules beside the packages (the command line, the launcher)
ROLES = ("frontend", "broker", "workers", "launcher")
SHARED = ("ipc", "configs", "dataplane")
#: Client tools: they import only ``TOOL_MAY_IMPORT`` of shoal.
TOOLS = ("analyze",)
TOOL_MAY_IMPORT = ("ipc", "configs")
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


def _part(module: str) -> str | None:
    """The role or shared package a module of the ``shoal`` namespace belongs to (None for
    anything else, and for the namespace itself)."""
    parts = module.split(".")
    if parts[0] != "shoal" or len(parts) == 1:
        return None
    return parts[1] if parts[1] in (*ROLES, *SHARED, *TOOLS) else "launcher"


def _exists(module: str) -> bool:
    path = ROOT / module.replace(".", "/")
    return path.with_suffix(".py").exists() or path.is_dir()


def _arrows() -> set[tuple[str, str]]:
    arrows: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "shoal").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        package = _part(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for module in _imports(path):
            top = _part(module)
            if top is None or top == package or not _exists(module):
                continue
            if package in TOOLS:
                if top not in TOOL_MAY_IMPORT:
                    arrows.add((rel, module))
            elif top in TOOLS:
                if package != "launcher":  # the command line runs the tools; nothing else
                    arrows.add((rel, module))
            elif top in ROLES or (package in SHARED and _LEVEL[top] > _LEVEL[package]):
                arrows.add((rel, module))
    return arrows


def test_no_role_imports_another_and_shared_code_imports_no_role() -> None:
    new = sorted(_arrows() - KNOWN)
    assert not new, f"imports across the layers (see this module's docstring): {new}"


def test_the_known_exceptions_are_still_there() -> None:
    gone = sorted(KNOWN - _arrows())
    assert not gone, f"no longer imported: remove from KNOWN: {gone}"


#: The model config's protobuf (Triton's ``ModelConfig``), by the modules that name it.
_PROTOBUF = ("tritonclient.grpc.model_config_pb2", "shoal.configs.model_config.ModelConfig")
#: Where the protobuf belongs: the config parser, its validation and auto-complete (and the
#: readers they share with the roles), the one place it becomes a ModelSpec
#: (``spec_reader``), and the gRPC adapter. The roles read ``shoal.configs.model_spec``.
PROTOBUF_HOMES: frozenset[str] = frozenset(
    {
        "shoal/configs/autocomplete.py",
        "shoal/configs/backend_params.py",
        "shoal/configs/ensemble.py",
        "shoal/configs/model_config.py",
        "shoal/configs/model_stamps.py",
        "shoal/configs/openvino_config.py",
        "shoal/configs/repository.py",
        "shoal/configs/sequence_rules.py",
        "shoal/configs/spec_reader.py",
        "shoal/configs/trt_config.py",
        "shoal/configs/validation.py",
        "shoal/frontend/grpc_codec.py",
    }
)
#: Modules outside those homes that still name the protobuf, each to move onto the spec;
#: the list only shrinks (it is empty now: keep it so).
PROTOBUF_KNOWN: frozenset[str] = frozenset()


def _protobuf_users() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in sorted((ROOT / "shoal").rglob("*.py"))
        if any(m in _PROTOBUF for m in _imports(path))
    }


def test_the_model_config_protobuf_stays_in_its_homes() -> None:
    new = sorted(_protobuf_users() - PROTOBUF_HOMES - PROTOBUF_KNOWN)
    assert not new, f"the ModelConfig protobuf outside its homes (read a ModelSpec): {new}"


def test_the_known_protobuf_users_are_still_there() -> None:
    gone = sorted(PROTOBUF_KNOWN - _protobuf_users())
    assert not gone, f"no longer names the protobuf: remove from PROTOBUF_KNOWN: {gone}"
