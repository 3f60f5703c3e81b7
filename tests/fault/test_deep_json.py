"""JSON nested past what any parser's recursion takes: a load's ``config`` override
10,000 deep (which used to reach the broker's catch-all: a 500 "maximum recursion depth
exceeded" and a traceback in its log) and a control body nested past Triton's 100. The
frontend refuses both with Triton's 400, and the broker never sees them."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, served
from tools import modelgen

DEPTH_ERROR = "JSON nesting depth exceeds maximum allowed limit (100)"
DEEP_CONFIG = '{"max_batch_size": 8, "parameters": ' + "[" * 10_000 + "]" * 10_000 + "}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("deep-json")
    modelgen.write_shipped_repository(repo, ("simple",))
    with served(repo, "--model-control-mode=explicit", "--load-model=simple") as srv:
        yield srv


def _broker_lines(srv: ShoalServer, since: int) -> list[str]:
    return [line for line in srv.log()[since:].splitlines() if "broker[" in line]


def test_a_10000_deep_config_override_is_a_400_and_the_broker_never_sees_it(
    server: ShoalServer,
) -> None:
    mark = len(server.log())
    body = json.dumps({"parameters": {"config": DEEP_CONFIG}}).encode()
    status, answer = server.http("/v2/repository/models/simple/load", body)
    assert (status, json.loads(answer)) == (400, {"error": DEPTH_ERROR})
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        with pytest.raises(InferenceServerException) as err:
            client.load_model("simple", config=DEEP_CONFIG)
    finally:
        client.close()
    assert (err.value.status(), err.value.message()) == ("StatusCode.INVALID_ARGUMENT", DEPTH_ERROR)
    assert server.http_status("/v2/models/simple/ready") == 200  # still the one loaded
    log = server.log()[mark:]
    assert "Traceback" not in log and "recursion" not in log, log
    assert not [line for line in _broker_lines(server, mark) if "simple" in line]


def test_a_config_at_the_depth_limit_still_reaches_the_broker(server: ShoalServer) -> None:
    """100 deep passes the frontend; the broker then judges the config (and refuses this
    one for its content, not its depth, without a traceback)."""
    mark = len(server.log())
    config = '{"parameters": ' + "[" * 99 + "]" * 99 + "}"
    body = json.dumps({"parameters": {"config": config}}).encode()
    status, answer = server.http("/v2/repository/models/simple/load", body)
    assert status == 500, answer
    assert "failed to poll from model repository" in json.loads(answer)["error"]
    assert "Traceback" not in server.log()[mark:]
    assert server.http_status("/v2/models/simple/ready") == 200


@pytest.mark.parametrize("path", ["/v2/repository/index", "/v2/logging"])
def test_a_control_body_nested_past_100_is_a_400(server: ShoalServer, path: str) -> None:
    """msgspec alone would take it (it stops near 1,000 levels)."""
    body = ('{"ready": false, "x": ' + "[" * 150 + "]" * 150 + "}").encode()
    status, answer = server.http(path, body)
    assert (status, json.loads(answer)) == (400, {"error": DEPTH_ERROR})
