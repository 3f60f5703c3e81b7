"""``pb_utils.load_model``, ``unload_model`` and ``is_model_ready``: a Python model's model
control, through the worker's scripting client (shoal/workers/bls.py) and the broker,
which refuses them outside explicit model control mode. Refusals raise
TritonModelException in the words of Triton's stub."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.ipc.errors import ServingError
from shoal.workers.pb_errors import TritonModelException, expect


def _control(what: str, call: Callable[[Any], Any]) -> Any:
    """A model control call on the worker's client; its refusal as Triton's stub raises it."""
    from shoal.workers import pb_utils  # (which exports these functions)

    try:
        return call(pb_utils._scripting())
    except ServingError as err:
        raise TritonModelException(f"Failed to {what}: {err.message}") from None


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load or reload ``model_name`` (explicit model control mode), with an optional
    config override (JSON text) and files (``"file:<path>"``: bytes; with a config)."""
    expect("load_model()", "model_name", model_name, str)
    expect("load_model()", "config", config, str)
    expect("load_model()", "files", files, (dict, type(None)))
    for key, data in (files or {}).items():
        expect("load_model()", "files", key, str)
        expect("load_model()", "files", data, (bytes, bytearray))
    given = {k: bytes(v) for k, v in (files or {}).items()}
    _control("load model", lambda c: c.load_model(model_name, config, given))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    expect("unload_model()", "model_name", model_name, str)
    expect("unload_model()", "unload_dependents", unload_dependents, bool)
    _control("unload model", lambda c: c.unload_model(model_name, unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether that version (any version for "") of the model is ready."""
    expect("is_model_ready()", "model_name", model_name, str)
    expect("is_model_ready()", "model_version", model_version, str)
    if model_version and not (model_version.isdigit() and int(model_version) > 0):
        raise TritonModelException(
            f"failed to get model version from specified version string '{model_version}', "
            "version should be an integral value > 0"
        )
    ready: bool = _control(
        "check model readiness", lambda c: c.is_model_ready(model_name, model_version)
    )
    return ready
