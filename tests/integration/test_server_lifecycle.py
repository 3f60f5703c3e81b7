"""A server's life as Triton's L0_lifecycle tests it: what a start that cannot serve
does, with tritonclient over HTTP and gRPC."""

from __future__ import annotations

from pathlib import Path

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
