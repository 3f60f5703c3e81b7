"""SHOAL_HOP_TIMING=1: each process stamps a request's way, and the frontend sums every leg
(``GET /v2/shoal/frontend``, ``hops_ns``); without it nothing is stamped or shown."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from shoal.dataplane.broker_client import HOPS
from tests.serverctl import ShoalServer
from tools import modelgen


def _simple_repo(tmp_path: Path) -> Path:
    modelgen.write_model(tmp_path, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    return tmp_path


def _simple_inputs(module: object) -> list[object]:
    a = module.InferInput("INPUT0", [1, 16], "INT32")  # type: ignore[attr-defined]
    b = module.InferInput("INPUT1", [1, 16], "INT32")  # type: ignore[attr-defined]
    a.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    b.set_data_from_numpy(np.ones((1, 16), np.int32))
    return [a, b]


def test_every_leg_of_each_request_is_counted_once(tmp_path: Path) -> None:
    srv = ShoalServer(_simple_repo(tmp_path), env={"SHOAL_HOP_TIMING": "1"})
    try:
        http = httpclient.InferenceServerClient(srv.url)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        for _ in range(3):
            assert http.infer("simple", _simple_inputs(httpclient)).as_numpy("OUTPUT0") is not None
            assert grpc.infer("simple", _simple_inputs(grpcclient)).as_numpy("OUTPUT0") is not None
        hops = json.loads(srv.http("/v2/shoal/frontend")[1])["hops_ns"]
        assert list(hops) == list(HOPS)
        for count, total_ns in hops.values():
            assert count == 6  # every leg of every request, once
            assert total_ns > 0  # (monotonic stamps: each leg takes some time)
        http.close()
        grpc.close()
    finally:
        assert srv.stop() == 0


def test_without_it_nothing_is_stamped(tmp_path: Path) -> None:
    srv = ShoalServer(_simple_repo(tmp_path), env={"SHOAL_HOP_TIMING": ""})
    try:
        http = httpclient.InferenceServerClient(srv.url)
        http.infer("simple", _simple_inputs(httpclient))
        assert "hops_ns" not in json.loads(srv.http("/v2/shoal/frontend")[1])
        http.close()
    finally:
        assert srv.stop() == 0
