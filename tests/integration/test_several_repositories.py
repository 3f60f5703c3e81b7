"""``--model-repository`` given more than once (Triton's): one server over the models of
every repository; a name in two of them stops the start (Triton's words, without
``--model-namespacing``); poll and explicit modes see what changes in any of them."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.repos import SIMPLE_ENSEMBLE, infer_identity, write_identity
from tests.serverctl import free_port, served
from tools import modelgen


def _simple(client: httpclient.InferenceServerClient, model: str = "simple") -> np.ndarray:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return client.infer(model, inputs).as_numpy("OUTPUT0")  # type: ignore[no-any-return]


def _until(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_models_of_every_repository_are_served_and_an_ensemble_spans_them(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    modelgen.write_shipped_repository(first, ("simple",))
    write_identity(second, "identity")
    (second / "ens" / "1").mkdir(parents=True)
    (second / "ens" / "config.pbtxt").write_text(SIMPLE_ENSEMBLE)  # its step is in first
    with served(first, f"--model-repository={second}") as srv:
        client = httpclient.InferenceServerClient(srv.url)
        np.testing.assert_array_equal(_simple(client), 2 * np.arange(16)[None])
        np.testing.assert_array_equal(
            infer_identity(srv.url, "identity", 3.0), np.full((1, 4), 3.0)
        )
        assert sorted(e["name"] for e in client.get_model_repository_index()) == [
            "ens",
            "identity",
            "simple",
        ]
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("IN0", "IN1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("ens", inputs).as_numpy("OUT"), 2 * a)


def test_a_model_name_in_two_repositories_stops_the_start(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    modelgen.write_shipped_repository(first, ("simple",))
    modelgen.write_shipped_repository(second, ("simple", "mlp"))
    argv = [sys.executable, "-m", "shoal", "serve",
            f"--model-repository={first}", f"--model-repository={second}",
            f"--http-port={free_port()}", f"--grpc-port={free_port()}",
            f"--metrics-port={free_port()}", f"--runtime-dir={tmp_path / 'run'}"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "failed to poll model 'simple': not unique across all model repositories" in (
        done.stderr
    )


def test_poll_mode_sees_changes_in_each_repository(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    modelgen.write_shipped_repository(first, ("simple",))
    second.mkdir()
    args = (f"--model-repository={second}", "--model-control-mode=poll",
            "--repository-poll-secs=0.3")  # fmt: skip
    with served(first, *args) as srv:
        client = httpclient.InferenceServerClient(srv.url)
        write_identity(second, "identity")
        _until(lambda: client.is_model_ready("identity"))
        config = first / "simple" / "config.pbtxt"
        config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 2"))
        _until(lambda: client.get_model_config("simple")["max_batch_size"] == 2)
        # the same name appearing in the other repository: it is left out, as Triton does
        modelgen.write_shipped_repository(second, ("simple",))
        _until(lambda: not client.is_model_ready("simple"))
        assert [e["name"] for e in client.get_model_repository_index()] == ["identity"]


def test_explicit_mode_loads_from_any_repository(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    modelgen.write_shipped_repository(first, ("simple",))
    second.mkdir()
    args = (f"--model-repository={second}", "--model-control-mode=explicit",
            "--load-model=simple")  # fmt: skip
    with served(first, *args) as srv:
        client = httpclient.InferenceServerClient(srv.url)
        write_identity(second, "identity")  # after the start
        client.load_model("identity")
        np.testing.assert_array_equal(
            infer_identity(srv.url, "identity", 2.0), np.full((1, 4), 2.0)
        )
        _until(lambda: "identity" in {e["name"] for e in client.get_model_repository_index()})
        client.unload_model("identity")
        assert not client.is_model_ready("identity")


def test_one_repository_named_twice_is_one(tmp_path: Path) -> None:
    """Triton keeps its repositories in a set (L0_lifecycle test_config_override)."""
    modelgen.write_shipped_repository(tmp_path, ("simple",))
    with served(tmp_path, f"--model-repository={tmp_path}/.") as srv:
        client = httpclient.InferenceServerClient(srv.url)
        assert client.is_model_ready("simple")
