"""What the tests of repositories in object storage share (S3, and gs:// and az:// on
their emulators): one inference of the shipped `simple` model, waiting for a condition,
the model caches a server left, and the
walk through explicit model control they all take."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tools import modelgen


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


def explicit_mode_serves_what_the_store_holds(
    local: Path,
    serve: Callable[..., AbstractContextManager[Any]],
    upload: Callable[[Path, str], None],
    put: Callable[[str, bytes], None],
) -> None:
    """Explicit model control on a repository in object storage (``serve(*flags)`` starts
    the server on it; ``upload(folder, prefix)`` and ``put(key, body)`` write to it): only
    the loaded model's files are fetched, a model uploaded later loads, a changed config
    applies at the next load, and an absent model fails in Triton's words."""
    modelgen.write_shipped_repository(local, ("simple", "mlp"))
    upload(local / "simple", "simple")  # at the store's top
    upload(local / "mlp", "mlp")
    with serve("--model-control-mode=explicit", "--load-model=simple") as srv:
        client = httpclient.InferenceServerClient(srv.url)
        np.testing.assert_array_equal(infer_simple(client, httpclient), 2 * np.arange(16)[None])
        (cache,) = caches_of(srv.proc.pid)
        # the model that did not load: its config only, not its files
        assert (cache / "mlp" / "config.pbtxt").is_file()
        assert not (cache / "mlp" / "1" / "model.onnx").exists()
        index = {e["name"]: e.get("state", "") for e in client.get_model_repository_index()}
        assert index == {"simple": "READY", "mlp": ""}
        client.load_model("mlp")
        assert client.is_model_ready("mlp")
        # a model uploaded after the start loads, and the index lists it
        modelgen.write_model(
            local, "copy", modelgen.simple_model(),
            (local / "simple" / "config.pbtxt").read_text().replace('"simple"', '"copy"'),
        )  # fmt: skip
        upload(local / "copy", "copy")
        client.load_model("copy")
        np.testing.assert_array_equal(
            infer_simple(client, httpclient, "copy"), 2 * np.arange(16)[None]
        )
        until(lambda: "copy" in {e["name"] for e in client.get_model_repository_index()})
        # a changed config takes effect at the next load
        config = (local / "simple" / "config.pbtxt").read_text()
        put(
            "simple/config.pbtxt", config.replace("max_batch_size: 8", "max_batch_size: 2").encode()
        )
        client.load_model("simple")
        assert client.get_model_config("simple")["max_batch_size"] == 2
        # a model not in the store fails as Triton's poll does
        with pytest.raises(Exception, match="failed to poll from model repository"):
            client.load_model("absent")
        assert client.is_server_live()
