"""Triton's logging extension (/v2/logging, gRPC LogSettings) on the real server: the
settings, the checks of an update in Triton 2.51's words, and the change reaching every
process (broker, frontend, workers, and a worker restarted afterwards), seen in the log."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, served
from tools import modelgen

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("logging-repo")
    modelgen.write_shipped_repository(repo, ("simple",))
    with served(repo) as srv:
        yield srv


@pytest.fixture
def server(shared_server: ShoalServer) -> Iterator[ShoalServer]:
    """The module's server, its log settings back to the defaults after each test."""
    yield shared_server
    reset = {k: v for k, v in DEFAULTS.items() if k != "log_file"}
    assert _post(shared_server, json.dumps(reset).encode()) == (200, DEFAULTS)


def _post(server: ShoalServer, body: bytes) -> tuple[int, dict]:
    status, reply = server.http("/v2/logging", body)
    return status, json.loads(reply)


def _infer(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    client.infer("simple", inputs)


def _unparsable_grpc(server: ShoalServer) -> None:
    """A message that does not parse: the frontend logs one WARNING line for it."""
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        with pytest.raises(grpc.RpcError):
            call(b"\xff\xff\xff", timeout=10)


def _log_since(server: ShoalServer, mark: int, wait_for: str = "") -> str:
    deadline = time.monotonic() + 10
    while wait_for and wait_for not in server.log()[mark:] and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.log()[mark:]


BATCH = "D shoal.worker: batch"


def _only_the_next_request_is_logged_verbosely(server: ShoalServer, mark: int) -> None:
    """Verbose on, one request: its DEBUG lines (one from the broker, one from the worker)
    are the only ones since ``mark``. Those of an earlier request would be there first."""
    assert _post(server, b'{"log_verbose_level": 1}') == (200, {**DEFAULTS, "log_verbose_level": 1})
    _infer(server)
    seen = _log_since(server, mark, BATCH)
    assert seen.count(BATCH) == 1 and seen.count("D shoal.broker: request") == 1, seen
    assert re.search(
        r"broker\[\d+\] D shoal\.broker: request \d+ of .* for simple/1 admitted", seen
    )
    assert re.search(r"worker:simple/1#0\[\d+\] D shoal\.worker: batch \d+: 1 request", seen)


def test_verbose_level_reaches_the_broker_and_workers_then_goes(server: ShoalServer) -> None:
    assert httpclient.InferenceServerClient(server.url).get_log_settings() == DEFAULTS
    mark = len(server.log())
    _infer(server)  # at the default level: no DEBUG line
    _only_the_next_request_is_logged_verbosely(server, mark)
    assert _post(server, b'{"log_verbose_level": 0}')[0] == 200
    mark = len(server.log())
    _infer(server)  # verbose off again: none
    _only_the_next_request_is_logged_verbosely(server, mark)


def _worker(server: ShoalServer) -> int | None:
    try:
        return server.worker_pid("simple")
    except LookupError:  # between its death and its restart
        return None


def test_a_restarted_worker_takes_the_changed_settings(server: ShoalServer) -> None:
    """From its welcome, before it loads: its own INFO line of the load is dropped."""
    assert _post(server, b'{"log_verbose_level": 2, "log_info": false}')[0] == 200
    old = server.worker_pid("simple")
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _worker(server) in (None, old) or server.http_status("/v2/models/simple/ready") != 200:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    new = server.worker_pid("simple")
    server.seen_pids.add(new)
    assert f"[{new}] I " not in server.log()  # its "loaded ..." line came before ready
    mark = len(server.log())
    _infer(server)
    assert f"worker:simple/1#0[{new}] D shoal.worker: batch" in _log_since(
        server, mark, f"[{new}] D shoal.worker"
    )


def test_severities_and_format_change_in_the_frontend_too(server: ShoalServer) -> None:
    """An unparsable message logged with warnings off, then one with them on: only the
    second one's WARNING line is there, in the new format."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    settings = client.update_log_settings({"log_warning": False}, as_json=True)["settings"]
    assert settings["log_warning"] == {"bool_param": False}
    mark = len(server.log())
    _unparsable_grpc(server)
    client.update_log_settings({"log_warning": True, "log_format": "ISO8601"})
    _unparsable_grpc(server)
    seen = _log_since(server, mark, "Unable to parse request")
    (line,) = [x for x in seen.splitlines() if "Unable to parse request" in x]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ frontend#0\[\d+\] W ", line), line
    got = client.get_log_settings(as_json=True)["settings"]
    assert got["log_format"] == {"string_param": "ISO8601"}
    client.close()


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b'{"log_file": "/tmp/x.log"}', 501,
         "log file location can not be updated through network protocol"),
        (b'{"log_info": "x", "log_file": ""}', 501, "log file location can not be updated"),
        (b'{"log_info": "x"}', 500, "attempt to access JSON non-boolean as boolean"),
        (b'{"log_verbose_level": -1}', 500,
         "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        (b'{"log_format": 5}', 500, "attempt to access JSON non-string as string"),
        (b'{"log_format": "bogus", "log_info": "x"}', 500, "non-boolean as boolean"),
        (b'{"log_format": "bogus", "log_verbose_level": 3}', 400,
         "invalid argument for --log_format, got: bogus"),
        (b"", 500, "failed to parse the request JSON buffer"),
    ],
)  # fmt: skip
def test_a_bad_update_changes_nothing(
    server: ShoalServer, body: bytes, status: int, message: str
) -> None:
    got, reply = _post(server, body)
    assert got == status and message in reply["error"]
    # applied whole or not at all (Triton 2.51 would have set the verbose level above)
    assert httpclient.InferenceServerClient(server.url).get_log_settings() == DEFAULTS


def test_null_members_are_ignored(server: ShoalServer) -> None:
    body = b'{"log_file": null, "log_info": null, "log_verbose_level": null}'
    assert _post(server, body) == (200, DEFAULTS)  # as Triton 2.51


def test_grpc_checks_each_settings_type(server: ShoalServer) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    for key, choice, value, code, message in [
        ("log_file", "string_param", "", "UNIMPLEMENTED", "log file location can not be"),
        ("log_info", "uint32_param", 1, "INVALID_ARGUMENT", "expect boolean for 'log_info'"),
        ("log_verbose_level", "bool_param", True, "INVALID_ARGUMENT", "expect int32 for"),
        ("log_format", "bool_param", True, "INVALID_ARGUMENT", "expect string for 'log_format'"),
        ("log_format", "string_param", "x", "INVALID_ARGUMENT", "invalid argument for log_format"),
    ]:
        request = pb.LogSettingsRequest()
        setattr(request.settings[key], choice, value)
        with pytest.raises(grpc.RpcError) as e:
            stub.LogSettings(request, timeout=10)
        assert e.value.code().name == code and message in e.value.details()
    channel.close()
    with pytest.raises(InferenceServerException, match="log file location"):
        grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}").update_log_settings(
            {"log_file": "/tmp/y"}
        )
    assert (
        "logging"
        in httpclient.InferenceServerClient(server.url).get_server_metadata()["extensions"]
    )
