"""Restricted API groups: the flag's parsing, and every HTTP route and gRPC method of
the server belonging to Triton's group for it (a route added without one would escape
a restriction; this test names it)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from grpc_health.v1 import health_pb2
from tritonclient.grpc import service_pb2 as pb

from shoal.configs.flags.frontend import restrictions
from shoal.frontend import restricted
from shoal.frontend.http_server import build_app


def test_groups_parse_and_refuse_as_triton() -> None:
    rules = restrictions(
        ["model-repository, statistics:admin-key=s:e=cret", "inference:k=v"],
        "--http-restricted-api",
    )
    assert rules == {
        "model-repository": ("admin-key", "s:e=cret"),
        "statistics": ("admin-key", "s:e=cret"),
        "inference": ("k", "v"),
    }
    for values, words in [
        (["bogus:k=v"], "unknown restricted api 'bogus'"),
        (["health:k=v", "health:j=w"], "'health' can not be specified in multiple config groups"),
        (["health"], "option format is '<config name>:<setting>=<value>'. Got health"),
        (["health:k"], "option format is '<config name>:<setting>=<value>'. Got health:k"),
        ([":k=v"], "option format is '<config name>:<setting>=<value>'. Got :k=v"),
        (["inference:k="], "Got inference:k="),  # an empty value: any empty header would do
    ]:
        with pytest.raises(ValueError, match=re.escape(words)):
            restrictions(values, "--http-restricted-api")
    with pytest.raises(ValueError, match="unknown restricted protocol 'x'"):
        restrictions(["x:k=v"], "--grpc-restricted-protocol")


def test_every_http_route_is_in_a_group() -> None:
    broker = SimpleNamespace(index=0, on_models_changed=[], on_broker_lost=[])
    app = build_app(SimpleNamespace(broker=broker), 1024)  # type: ignore[arg-type]
    paths = {
        re.sub(r"\{[^}]*\}", "1", r.resource.canonical)
        for r in app.router.routes()
        if r.resource is not None
    }
    assert len(paths) > 20
    assert {
        p: restricted.http_category(p) for p in paths if restricted.http_category(p) is None
    } == {}
    assert restricted.http_category("/v2/models/m/versions/2/infer") == "inference"
    assert restricted.http_category("/v2/models/stats") == "statistics"
    assert restricted.http_category("/v2/models/m/ready") == "health"
    assert restricted.http_category("/v2/models/m") == "metadata"
    assert restricted.http_category("/v2/models/m/config") == "model-config"
    assert restricted.http_category("/v1/chat/completions") == "inference"
    assert restricted.http_category("/v1/models/m") == "model-repository"
    assert restricted.http_category("/metrics") is None


def test_every_grpc_method_is_in_a_group() -> None:
    methods = [
        f"/inference.GRPCInferenceService/{m.name}"
        for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    ] + [
        f"/grpc.health.v1.Health/{m.name}"
        for m in health_pb2.DESCRIPTOR.services_by_name["Health"].methods
    ]
    assert {
        m: restricted.grpc_category(m) for m in methods if not restricted.grpc_category(m)
    } == {}
    assert (
        restricted.grpc_category("/inference.GRPCInferenceService/ModelStreamInfer") == "inference"
    )
    assert restricted.grpc_category("/grpc.health.v1.Health/Check") == "health"
    assert restricted.grpc_category("/other.Service/ModelInfer") is None
