"""Several frontend processes sharing the HTTP and gRPC ports (SO_REUSEPORT), one broker."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.serverctl import ShoalServer
from tools import modelgen


@pytest.fixture(scope="module")
def two_frontends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("frontends-repo")
    modelgen.write_shipped_repository(repo)
    srv = ShoalServer(
        repo,
        "--frontend-processes=2",
        "--allow-client-shm=true",
        env={"SHOAL_CPU_SCHED": "batch"},  # the default, whatever the caller's environment
    )
    # Ready means one frontend answers; wait for the second to listen too.
    deadline = time.monotonic() + 30
    indices: set[int] = set()
    while len(indices) < 2 and time.monotonic() < deadline:
        indices.add(_status(srv.url)["index"])
    assert indices == {0, 1}
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def _body() -> tuple[bytes, int]:
    ins = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    body, json_len = httpclient.InferenceServerClient.generate_request_body(ins)
    return body, json_len


def _post_simple(conn: http.client.HTTPConnection) -> str:
    """One inference of `simple` on ``conn``; returns the frontend that answered."""
    body, json_len = _body()
    conn.request(
        "POST",
        "/v2/models/simple/infer",
        body=body,
        headers={"Inference-Header-Content-Length": str(json_len)},
    )
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 200
    return str(resp.getheader("Shoal-Frontend"))


def _infer_on_new_connection(url: str) -> str:
    conn = http.client.HTTPConnection(url, timeout=10)
    try:
        return _post_simple(conn)
    finally:
        conn.close()


def _status(url: str) -> dict[str, int]:
    conn = http.client.HTTPConnection(url, timeout=10)
    try:
        conn.request("GET", "/v2/shoal/frontend")
        return dict(json.loads(conn.getresponse().read()))
    finally:
        conn.close()


def test_http_requests_reach_both_processes(two_frontends: ShoalServer) -> None:
    assert len(two_frontends.pids("frontend")) == 2
    seen = [_infer_on_new_connection(two_frontends.url) for _ in range(60)]
    assert set(seen) == {"0", "1"}
    counts: dict[int, int] = {}
    for _ in range(60):
        st = _status(two_frontends.url)
        counts[st["index"]] = st["inference_requests"]
        if len(counts) == 2:
            break
    assert set(counts) == {0, 1}
    assert all(n > 0 for n in counts.values())


def test_grpc_channels_reach_both_processes(two_frontends: ShoalServer) -> None:
    seen = set()
    for _ in range(60):
        with grpc.insecure_channel(f"127.0.0.1:{two_frontends.grpc_port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            _, call = stub.ServerMetadata.with_call(service_pb2.ServerMetadataRequest())
            seen.add(dict(call.trailing_metadata())["shoal-frontend"])
        if len(seen) == 2:
            break
    assert seen == {"0", "1"}


def test_one_frontend_dies_the_other_keeps_serving(two_frontends: ShoalServer) -> None:
    # A keep-alive connection stays with the process that accepted it.
    conn = http.client.HTTPConnection(two_frontends.url, timeout=10)
    conn.request("GET", "/v2/shoal/frontend")
    owner = json.loads(conn.getresponse().read())
    victim = next(p for p in two_frontends.pids("frontend") if p != owner["pid"])
    stop = threading.Event()
    failures: list[BaseException] = []
    served = [0]

    def keep_sending() -> None:
        try:
            while not stop.is_set():
                assert _post_simple(conn) == str(owner["index"])
                served[0] += 1
        except BaseException as exc:  # collected and asserted below
            failures.append(exc)

    t = threading.Thread(target=keep_sending)
    t.start()
    time.sleep(0.5)
    before = served[0]
    os.kill(victim, signal.SIGKILL)
    time.sleep(1.5)
    stop.set()
    t.join(15)
    conn.close()
    assert not failures, failures
    assert served[0] > before > 0

    # The killed process is restarted and serves again.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pids = two_frontends.pids("frontend")
        if len(pids) == 2 and victim not in pids:
            break
        time.sleep(0.2)
    assert victim not in two_frontends.pids("frontend")
    two_frontends.seen_pids |= set(two_frontends.pids())
    indices: set[int] = set()
    while len(indices) < 2 and time.monotonic() < deadline + 20:  # the new one listens
        indices.add(_status(two_frontends.url)["index"])
    seen = {_infer_on_new_connection(two_frontends.url) for _ in range(60)}
    assert seen == {"0", "1"}


def test_a_region_registered_through_one_frontend_serves_the_other(
    two_frontends: ShoalServer,
) -> None:
    import tritonclient.utils.shared_memory as shm

    key = f"/test_cross_{os.getpid()}"
    handle = shm.create_shared_memory_region("cross", key, 128)
    try:
        a, b = np.arange(16, dtype=np.int32), np.full(16, 2, dtype=np.int32)
        shm.set_shared_memory_region(handle, [a, b])
        conn = http.client.HTTPConnection(two_frontends.url, timeout=10)
        conn.request(
            "POST",
            "/v2/systemsharedmemory/region/cross/register",
            body=json.dumps({"key": key, "offset": 0, "byte_size": 128}),
        )
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        registered_on = resp.getheader("Shoal-Frontend")
        conn.close()
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "shape": [1, 16],
                        "datatype": "INT32",
                        "parameters": {
                            "shared_memory_region": "cross",
                            "shared_memory_byte_size": 64,
                        },
                    },
                    {
                        "name": "INPUT1",
                        "shape": [1, 16],
                        "datatype": "INT32",
                        "parameters": {
                            "shared_memory_region": "cross",
                            "shared_memory_offset": 64,
                            "shared_memory_byte_size": 64,
                        },
                    },
                ],
                "outputs": [{"name": "OUTPUT0"}],
            }
        ).encode()
        served_by = set()
        for _ in range(60):
            c = http.client.HTTPConnection(two_frontends.url, timeout=10)
            c.request("POST", "/v2/models/simple/infer", body=header)
            r = c.getresponse()
            doc = json.loads(r.read())
            assert r.status == 200, doc
            assert doc["outputs"][0]["data"] == list(range(2, 18))
            served_by.add(r.getheader("Shoal-Frontend"))
            c.close()
        assert served_by == {"0", "1"}
        assert registered_on in served_by
    finally:
        c = http.client.HTTPConnection(two_frontends.url, timeout=10)
        c.request("POST", "/v2/systemsharedmemory/region/cross/unregister")
        c.getresponse().read()
        shm.destroy_shared_memory_region(handle)


def test_every_thread_of_every_role_runs_sched_batch(two_frontends: ShoalServer) -> None:
    """Threads started later (ZeroMQ's, grpcio's, the model runtime's) inherit it."""
    roles = {role: two_frontends.pids(role) for role in ("broker", "frontend", "workers")}
    assert len(roles["broker"]) == 1 and len(roles["frontend"]) == 2 and roles["workers"]
    for role, pids in roles.items():
        for pid in pids:
            policies = {}
            for tid in (int(t) for t in os.listdir(f"/proc/{pid}/task")):
                with contextlib.suppress(ProcessLookupError):  # a pool thread that retired
                    policies[tid] = os.sched_getscheduler(tid)
            assert len(policies) > 1
            assert set(policies.values()) == {os.SCHED_BATCH}, (role, pid, policies)


def _trace_setting(url: str, body: bytes | None = None) -> tuple[str, dict[str, object]]:
    """The frontend that answered, and simple's trace settings (after ``body``'s update)."""
    conn = http.client.HTTPConnection(url, timeout=10)
    try:
        conn.request("POST" if body else "GET", "/v2/models/simple/trace/setting", body=body)
        resp = conn.getresponse()
        doc = json.loads(resp.read())
        assert resp.status == 200, doc
        return str(resp.getheader("Shoal-Frontend")), doc
    finally:
        conn.close()


def test_a_trace_setting_changed_through_one_frontend_is_every_frontends(
    two_frontends: ShoalServer,
) -> None:
    changed_on, doc = _trace_setting(two_frontends.url, b'{"trace_rate": "7"}')
    assert doc["trace_rate"] == "7"
    try:
        answers: dict[str, object] = {}
        for _ in range(60):
            frontend, doc = _trace_setting(two_frontends.url)
            answers[frontend] = doc["trace_rate"]
            if len(answers) == 2:
                break
        assert answers == {"0": "7", "1": "7"} and changed_on in answers
    finally:
        _trace_setting(two_frontends.url, b'{"trace_rate": null}')
