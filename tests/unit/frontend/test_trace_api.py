"""The trace extension's checks and answers (shoal/frontend/trace_api.py), in Triton's
words, and Triton's trace file entries (shoal/frontend/trace_sink.py)."""

from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2 as pb

from shoal.frontend import trace_api
from shoal.frontend.trace_sink import triton_entries
from shoal.ipc.errors import Code, ServingError
from shoal.ipc.messages import TraceRecord, TraceReply, TraceSetting


def test_http_changes_read_strings_and_nulls_clear() -> None:
    doc = {"trace_level": ["TENSORS", "TIMESTAMPS"], "trace_rate": "12x", "trace_count": None}
    assert trace_api.http_changes(doc) == {
        "levels": ["TIMESTAMPS", "TENSORS"],
        "rate": 12,
        "count": None,
    }
    assert trace_api.http_changes({"trace_level": ["LOUD"]}) == {}  # (ignored, as Triton)
    assert trace_api.http_changes({"trace_level": ["OFF"]}) == {"levels": []}


@pytest.mark.parametrize(
    ("doc", "code", "message"),
    [
        ({"trace_file": "x"}, Code.UNSUPPORTED, trace_api.FILE_REFUSED),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, Code.INVALID_ARG, "Expect only one trace"),
        ({"trace_level": "OFF"}, Code.INTERNAL, "attempt to access JSON non-array as array"),
        ({"trace_rate": 5}, Code.INTERNAL, "attempt to access JSON non-string as string"),
        ({"trace_rate": "abc"}, Code.INVALID_ARG, "Unable to parse 'trace_rate', got: abc"),
        ({"trace_count": "-2"}, Code.INVALID_ARG, "Expecting value >= -1, got:-2"),
        (
            {"log_frequency": "99999999999"},
            Code.INVALID_ARG,
            "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ], got: "
            "99999999999",
        ),
    ],
)
def test_http_refusals(doc: dict[str, object], code: Code, message: str) -> None:
    with pytest.raises(ServingError) as err:
        trace_api.http_changes(doc)
    assert err.value.code == code and message in err.value.message


def test_grpc_changes_and_refusals() -> None:
    req = pb.TraceSettingRequest()
    req.settings["trace_rate"].value.append("3")
    req.settings["trace_level"].SetInParent()  # no value: cleared
    assert trace_api.grpc_changes(req.settings) == {"levels": None, "rate": 3}
    req.settings["trace_count"].value.extend(["1", "2"])
    with pytest.raises(ServingError, match="expect only 1 value for 'trace_count'"):
        trace_api.grpc_changes(req.settings)
    bad = pb.TraceSettingRequest()
    bad.settings["trace_count"].value.append("-7")
    with pytest.raises(ServingError, match="Expecting value >= -1, got: -7"):
        trace_api.grpc_changes(bad.settings)


def test_settings_as_triton_shows_them() -> None:
    reply = TraceReply(1, TraceSetting(("TIMESTAMPS",), 10, -1, 0, "/f"), "triton")
    assert trace_api.as_settings(reply, 4) == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "10",
        "trace_count": "4",
        "log_frequency": "0",
        "trace_file": "/f",
        "trace_mode": "triton",
    }
    otel = TraceReply(1, TraceSetting(), "opentelemetry", {"url": "u"})
    assert trace_api.as_settings(otel, None) == {
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "trace_mode": "opentelemetry",
        "url": "u",
    }


def test_a_trace_and_its_children_in_tritons_file_order() -> None:
    child = TraceRecord(2, "step", 1, parent_id=1, stamps=[("REQUEST_START", 5)])
    root = TraceRecord(1, "ens", 1, request_id="r", stamps=[("REQUEST_START", 4)])
    root.children = [child]
    assert triton_entries(root) == [
        {"id": 1, "model_name": "ens", "model_version": 1, "request_id": "r"},
        {"id": 1, "timestamps": [{"name": "REQUEST_START", "ns": 4}]},
        {"id": 2, "model_name": "step", "model_version": 1, "parent_id": 1},
        {"id": 2, "timestamps": [{"name": "REQUEST_START", "ns": 5}]},
    ]
