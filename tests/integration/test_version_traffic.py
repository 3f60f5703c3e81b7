"""Traffic between a model's versions by weight (docs/version-traffic.md): the split of
requests that name no version, sticky route keys, shadow traffic, and what becomes of the
split when weights change or a version leaves while requests flow.

One server (explicit model control) serves the module: an identity model ``ab`` with
versions 1, 2 and 3; each answer says which version gave it (``model_version``). The
unkeyed split is smooth weighted round-robin, exact over each run as long as the weights'
sum; a test that starts where an earlier one left the round may be off by one request per
version, the tolerance stated below."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shoal.broker.traffic import sticky_version
from tests.repos import write_identity
from tests.serverctl import ShoalServer, served

MODEL = "ab"
POLICY = """parameters [
  { key: "shoal_version_weights" value { string_value: "1:3,2:1" } },
  { key: "shoal_shadow" value { string_value: "3:25" } } ]
version_policy { all {} }"""
SLACK = 1  # requests per version a run may be off, starting midway through a round


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("traffic")
    write_identity(repo, MODEL, POLICY)
    for version in (2, 3):
        shutil.copytree(repo / MODEL / "1", repo / MODEL / str(version))
    with served(repo, "--model-control-mode=explicit", f"--load-model={MODEL}") as srv:
        yield srv


@pytest.fixture
def client(server: ShoalServer) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.url, network_timeout=60)
    yield c
    c.close()


DATA = np.arange(4, dtype=np.float32).reshape(1, 4)


def _input() -> httpclient.InferInput:
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(DATA)
    return inp


def _infer(client: httpclient.InferenceServerClient, key: str = "") -> int:
    """One request naming no version; the version that answered (its output checked)."""
    params = {"shoal_route_key": key} if key else None
    result = client.infer(MODEL, [_input()], parameters=params)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA)
    return int(result.get_response()["model_version"])


def _split(client: httpclient.InferenceServerClient, n: int) -> Counter[int]:
    return Counter(_infer(client) for _ in range(n))


def _count(client: httpclient.InferenceServerClient, version: int) -> int:
    stats = client.get_inference_statistics(MODEL, str(version))["model_stats"]
    return int(stats[0]["inference_count"]) if stats else 0


def _reload(client: httpclient.InferenceServerClient, server: ShoalServer, text: str) -> None:
    """Load ``ab`` with its config's policy part replaced by ``text`` (as JSON)."""
    cfg = client.get_model_config(MODEL)
    cfg.pop("parameters", None)
    cfg.update(json.loads(text))
    client.load_model(MODEL, config=json.dumps(cfg))


def test_requests_naming_no_version_follow_the_weights(
    client: httpclient.InferenceServerClient,
) -> None:
    got = _split(client, 40)
    assert abs(got[1] - 30) <= SLACK and abs(got[2] - 10) <= SLACK, got
    assert got[1] + got[2] == 40  # the shadow version never answers


def test_a_route_key_always_gets_its_version(
    server: ShoalServer, client: httpclient.InferenceServerClient
) -> None:
    keys = [f"user-{i}" for i in range(12)]
    first = {k: _infer(client, k) for k in keys}
    assert all(_infer(client, k) == first[k] for k in keys)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as g:  # the same
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
        for k in keys[:4]:
            answer = g.infer(MODEL, [inp], parameters={"shoal_route_key": k}).get_response()
            assert int(answer.model_version) == first[k]
            # the same key as gRPC metadata, and as an HTTP header
            answer = g.infer(MODEL, [inp], headers={"shoal-route-key": k}).get_response()
            assert int(answer.model_version) == first[k]
    for k in keys[:4]:
        answer = client.infer(MODEL, [_input()], headers={"shoal-route-key": k})
        assert int(answer.get_response()["model_version"]) == first[k]
    # where the documented hash puts them: the same on every server, after every restart
    assert first == {k: sticky_version([(1, 3), (2, 1)], k) for k in keys}


def test_shadow_answers_are_never_returned_and_are_counted(
    server: ShoalServer, client: httpclient.InferenceServerClient
) -> None:
    before = _count(client, 3)
    got = _split(client, 40)
    assert 3 not in got
    deadline = time.monotonic() + 10  # the copies run beside their answers: await them
    while _count(client, 3) < before + 10:
        assert time.monotonic() < deadline, f"shadow count {_count(client, 3) - before}"
        time.sleep(0.05)
    assert _count(client, 3) == before + 10  # 25 % of 40, exactly (a counter, not chance)
    # and its metrics series, beside the answering versions'
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics").read()
    shadow = re.search(rb'nv_inference_request_success\{model="ab",version="3"\} (\d+)', text)
    assert shadow is not None and int(shadow.group(1)) == before + 10


def test_a_bad_policy_fails_its_load_and_the_loaded_one_serves_on(
    server: ShoalServer, client: httpclient.InferenceServerClient
) -> None:
    bad = '{"parameters": {"shoal_version_weights": {"string_value": "1:0"}}}'
    with pytest.raises(InferenceServerException) as err:
        _reload(client, server, bad)
    # refused by the config's validation, as Triton refuses any config it cannot accept
    assert err.value.status() == "500"
    message = err.value.message()
    assert "failed to poll from model repository" in message
    assert "shoal_version_weights: expected '<version>:<positive number>'" in message
    assert abs(_split(client, 8)[1] - 6) <= SLACK  # 1:3,2:1 as before


@contextlib.contextmanager
def _flowing(url: str, failures: list[str]) -> Iterator[None]:
    """Requests naming no version, one after another from a thread, for the ``with``
    block (a reload); their errors go to ``failures``. At least one is answered."""
    stop, answered = threading.Event(), []

    def flow() -> None:
        c = httpclient.InferenceServerClient(url, network_timeout=60)
        try:
            while not stop.is_set() or not answered:
                try:
                    answered.append(_infer(c))
                except Exception as exc:  # recorded: the test asserts there is none
                    failures.append(repr(exc))
        finally:
            c.close()

    thread = threading.Thread(target=flow)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_weights_change_and_a_version_leaves_without_a_request_dropped(
    server: ShoalServer, client: httpclient.InferenceServerClient
) -> None:
    """Requests flow while each reload runs; the split is counted once it is done. (The
    module's last test: it leaves the model as it made it.)"""
    failures: list[str] = []
    weights = '{"parameters": {"shoal_version_weights": {"string_value": "1:1,2:3"}}}'
    with _flowing(server.url, failures):
        _reload(client, server, weights)
    got = _split(client, 40)
    assert abs(got[1] - 10) <= SLACK and abs(got[2] - 30) <= SLACK, got
    # version 2 leaves (the policy loads 1 and 3 only): its weight goes to version 1
    with _flowing(server.url, failures):
        _reload(client, server, weights[:-1] + ', "version_policy": {"specific": '
                '{"versions": [1, 3]}}}')  # fmt: skip
    assert _split(client, 20) == {1: 20}
    assert not failures, failures[:3]
