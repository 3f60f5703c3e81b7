"""A server's life as Triton's L0_lifecycle tests it: what a start that cannot serve
does, with tritonclient over HTTP and gRPC."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shoal.dataplane.plane import SERVER_VERSION
from tests.serverctl import ShoalServer, served


def _clients(srv: ShoalServer) -> list[object]:
    return [
        httpclient.InferenceServerClient(srv.client("http")[0]),
        grpcclient.InferenceServerClient(srv.client("grpc")[0]),
    ]


@pytest.mark.parametrize("strict", ["true", "false"])
def test_a_missing_repository_without_exit_on_error_leaves_a_server_neither_live_nor_ready(
    tmp_path: Path, strict: str
) -> None:
    """Triton's server that failed to initialize: it answers, says it is neither live nor
    ready whatever --strict-readiness says, gives its metadata and loads nothing; the
    repository that does exist beside the missing one is not served either."""
    models = tmp_path / "models"
    models.mkdir()
    missing = tmp_path / "xyzx"
    args = (
        f"--model-repository={missing}",
        f"--strict-readiness={strict}",
        "--exit-on-error=false",
        "--model-control-mode=explicit",
    )
    srv = ShoalServer(models, *args, wait_ready=False)
    try:
        srv.wait_answering()
        assert srv.http_status("/v2/health/live") == 400
        for client in _clients(srv):
            assert not client.is_server_live()  # type: ignore[attr-defined]
            assert not client.is_server_ready()  # type: ignore[attr-defined]
            md = client.get_server_metadata()  # type: ignore[attr-defined]
            version = md["version"] if isinstance(md, dict) else md.version
            assert version == SERVER_VERSION
            with pytest.raises(InferenceServerException, match="not live"):
                client.load_model("anything")  # type: ignore[attr-defined]
        assert f"model repository '{missing}' is not a directory" in srv.log()
    finally:
        assert srv.stop() == 0


def test_a_missing_repository_with_exit_on_error_stops_the_start(tmp_path: Path) -> None:
    srv = ShoalServer(tmp_path / "xyzx", wait_ready=False)
    assert srv.proc.wait(30) == 2
    assert "is not a directory" in srv.log()
    srv.stop()


def test_an_existing_repository_serves_as_before(tmp_path: Path) -> None:
    with served(tmp_path, "--exit-on-error=false") as srv:
        for client in _clients(srv):
            assert client.is_server_live()  # type: ignore[attr-defined]
            assert client.is_server_ready()  # type: ignore[attr-defined]


@pytest.mark.parametrize("service", ["HTTP", "GRPC", "Metrics"])
def test_a_port_in_use_stops_the_start_with_tritons_error(tmp_path: Path, service: str) -> None:
    """The line L0_lifecycle's port-collision checks grep for, once."""
    with served(tmp_path) as first:
        port = {"HTTP": first.http_port, "GRPC": first.grpc_port, "Metrics": first.metrics_port}
        flag = {"HTTP": "--http-port", "GRPC": "--grpc-port", "Metrics": "--metrics-port"}
        address = "0.0.0.0" if service == "GRPC" else "127.0.0.1"  # (metrics: HTTP's)
        second = ShoalServer(tmp_path, f"{flag[service]}={port[service]}", wait_ready=False)
        assert second.proc.wait(60) != 0
        second.stop()
        socket = f"{address}:{port[service]}"
        line = f"failed to start {service} service: Unavailable - Socket '{socket}' already in use"
        assert second.log().count(line) == 1, second.log()


_LOGGING_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(f"[model] loading version {args['model_version']}")

    def execute(self, requests):
        out = []
        for r in requests:
            data = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return out
"""
_LOGGING_CONFIG = """
name: "identity"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _policy(model: Path, versions: str) -> None:
    text = _LOGGING_CONFIG + f"version_policy: {{ specific: {{ versions: [{versions}] }} }}\n"
    (model / "config.pbtxt").write_text(text)


def test_a_reload_loads_again_only_the_versions_that_changed(tmp_path: Path) -> None:
    """Triton's L0_lifecycle test_load_new_model_version: an unmodified version serves on
    through a load, a changed one loads again, a new one loads; a change to what the
    versions share loads every version again; one the policy drops is unloaded."""
    model = tmp_path / "identity"
    for version in ("1", "2", "3"):
        (model / version).mkdir(parents=True)
        (model / version / "model.py").write_text(_LOGGING_MODEL)
    _policy(model, "1, 2")
    args = ("--model-control-mode=explicit", "--load-model=*")
    with served(tmp_path, *args) as srv:
        client = grpcclient.InferenceServerClient(srv.client("grpc")[0])

        def loads() -> list[int]:
            log = srv.log()
            return [log.count(f"[model] loading version {v}") for v in (1, 2, 3, 4)]

        assert loads() == [1, 1, 0, 0]
        assert srv.log().count("successfully loaded 'identity'") == 1
        time.sleep(0.05)  # (past the file system's clock tick since the load)
        (model / "2" / "model.py").touch()
        shutil.copytree(model / "3", model / "4")
        _policy(model, "1, 2, 3, 4")
        client.load_model("identity")
        assert all(client.is_model_ready("identity", v) for v in ("1", "2", "3", "4"))
        assert loads() == [1, 2, 1, 1]
        time.sleep(0.05)
        _policy(model, "4")
        client.load_model("identity")
        assert loads() == [1, 2, 1, 1]
        assert [client.is_model_ready("identity", v) for v in ("1", "2", "3", "4")] == [
            False, False, False, True,
        ]  # fmt: skip
        inp = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
        inp.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
        with pytest.raises(InferenceServerException, match="version 1 is not at ready state"):
            client.infer("identity", [inp], model_version="1")
        time.sleep(0.05)
        (model / "shared.py").write_text("# what every version imports\n")
        client.load_model("identity")
        assert loads() == [1, 2, 1, 2]
        assert srv.log().count("successfully loaded 'identity'") == 4


def test_a_start_up_model_no_repository_holds_stops_the_start_with_tritons_error(
    tmp_path: Path,
) -> None:
    args = ("--model-control-mode=explicit", "--load-model=does-not-exist")
    srv = ShoalServer(tmp_path, *args, wait_ready=False)
    assert srv.proc.wait(60) != 0
    srv.stop()
    line = "failed to poll model 'does-not-exist': model not found in any model repository."
    assert line in srv.log()


_FAILS_ONCE = """
import os


class TritonPythonModel:
    def initialize(self, args):
        marker = os.path.join(args["model_repository"], args["model_version"], "tried")
        if not os.path.exists(marker):
            open(marker, "x").close()
            raise Exception("failing the first load")

    def execute(self, requests):
        return []
"""


@pytest.mark.parametrize("retries", [0, 1])
def test_a_failed_load_is_tried_again_as_often_as_model_load_retry_count_says(
    tmp_path: Path, retries: int
) -> None:
    """Triton's L0_lifecycle test_load_retry: without retries the start fails (the
    model fails its one load), with one the model is ready."""
    model = tmp_path / "once"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(_FAILS_ONCE)
    (model / "config.pbtxt").write_text(_LOGGING_CONFIG.replace('"identity"', '"once"'))
    srv = ShoalServer(tmp_path, f"--model-load-retry-count={retries}", wait_ready=False)
    try:
        if retries == 0:
            assert srv.proc.wait(60) != 0
            assert "failing the first load" in srv.log()
        else:
            srv.wait_ready()
            assert srv.http_status("/v2/models/once/ready") == 200
            assert "load retry 1 of 1" in srv.log()
    finally:
        srv.stop()


_GATED = """
import os
import time


class TritonPythonModel:
    def initialize(self, args):
        gate = os.path.join(args["model_repository"], "gate")
        deadline = time.monotonic() + 120
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)

    def execute(self, requests):
        return []
"""


def test_lenient_readiness_waits_for_the_start_up_loads_whatever_becomes_of_them(
    tmp_path: Path,
) -> None:
    """With --strict-readiness=false the server is ready once its start-up loads are over,
    as Triton's (core sets SERVER_READY after the repository manager's start-up loads;
    strictness only decides whether a model that failed keeps it unready): live at once,
    not ready while a model loads, ready after, beside a model that failed."""
    gated = tmp_path / "gated"
    (gated / "1").mkdir(parents=True)
    (gated / "1" / "model.py").write_text(_GATED)
    (gated / "config.pbtxt").write_text(_LOGGING_CONFIG.replace('"identity"', '"gated"'))
    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "1" / "model.py").write_text("raise ImportError('broken on purpose')\n")
    (broken / "config.pbtxt").write_text(_LOGGING_CONFIG.replace('"identity"', '"broken"'))
    args = ("--strict-readiness=false", "--exit-on-error=false")
    srv = ShoalServer(tmp_path, *args, wait_ready=False)
    try:
        srv.wait_answering()
        for client in _clients(srv):
            assert client.is_server_live()  # type: ignore[attr-defined]
            assert not client.is_server_ready()  # type: ignore[attr-defined]
        assert srv.http_status("/v2/health/ready") == 400
        (gated / "gate").touch()
        srv.wait_ready()
        for client in _clients(srv):
            assert client.is_server_ready()  # type: ignore[attr-defined]
            assert client.is_model_ready("gated")  # type: ignore[attr-defined]
            assert not client.is_model_ready("broken")  # type: ignore[attr-defined]
    finally:
        assert srv.stop() == 0
    # each loaded version's unload at the stop, in Triton's words (L0_lifecycle counts them)
    assert srv.log().count("successfully unloaded 'gated' version 1") == 1
    assert "successfully unloaded 'broken'" not in srv.log()
