"""What the tests of repositories in object storage share (S3, and gs:// and az:// on
their emulators): one inference of the shipped `simple` model, waiting for a condition,
and the model caches a server left."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def infer_simple(client: Any, module: Any, model: str = "simple") -> np.ndarray:
    """``simple``'s OUTPUT0 for a fixed input, through ``client`` (``module`` is
    tritonclient.http or tritonclient.grpc)."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return client.infer(model, inputs).as_numpy("OUTPUT0")  # type: ignore[no-any-return]


def until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def caches_of(pid: int) -> list[Path]:
    """The local copies of a repository's models that the server ``pid`` made."""
    return list(Path(tempfile.gettempdir()).glob(f"shoal-models-{pid}"))
