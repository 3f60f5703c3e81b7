"""Triton's classification extension end to end, with the real tritonclient over HTTP
and gRPC: ``class_count`` (the output parameter ``classification``) turns an output into
the top-K "value:index[:label]" strings, labels from the output's ``label_filename``.
Each answer was compared with Triton 2.51's (triton-peer) on the same requests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import identity_config
from tests.serverctl import ShoalServer, settled_server
from tools import modelgen

LABELS = "cat\ndog\n\nbird\n"  # the third class has no label


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("classification-repo")
    modelgen.write_shipped_repository(repo, models=("simple",))
    labelled = identity_config("labelled", "FP32", "[ -1 ]", 8).replace(
        '"OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ]',
        '"OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] label_filename: "labels.txt"',
    )
    model_dir = modelgen.write_model(
        repo, "labelled", modelgen.identity_model("FP32", [-1], batch=True), labelled
    )
    (model_dir / "labels.txt").write_text(LABELS)
    modelgen.write_model(
        repo,
        "flat",
        modelgen.identity_model("FP32", [-1], batch=False),
        identity_config("flat", "FP32", "[ -1 ]", 0),
    )
    modelgen.write_model(
        repo,
        "booleans",
        modelgen.identity_model("BOOL", [-1], batch=True),
        identity_config("booleans", "BOOL", "[ -1 ]", 8),
    )
    unreadable = labelled.replace('"labelled"', '"unlabelled"')
    modelgen.write_model(
        repo, "unlabelled", modelgen.identity_model("FP32", [-1], batch=True), unreadable
    )  # its labels.txt is missing: the load fails, as in Triton
    for name, labels in (("relabelled", 'label_filename: "own.txt"'), ("inherits", "")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(_ENSEMBLE.format(name=name, labels=labels))
    (repo / "relabelled" / "own.txt").write_text("w\nx\ny\nz\n")
    models = ("simple", "labelled", "flat", "booleans", "unlabelled", "relabelled", "inherits")
    with settled_server(repo, models) as srv:
        yield srv


#: An ensemble of one step over ``labelled``, with labels of its own for OUT or none.
_ENSEMBLE = """
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] {labels} }} ]
ensemble_scheduling {{ step [ {{ model_name: "labelled" model_version: -1
  input_map {{ key: "INPUT0" value: "IN" }} output_map {{ key: "OUTPUT0" value: "OUT" }} }} ] }}
"""


def _post(srv: ShoalServer, model: str, doc: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"http://{srv.url}/v2/models/{model}/infer", data=json.dumps(doc).encode()
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _ints(name: str, values: list[int], shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": "INT32", "shape": shape, "data": values}


def test_json_top_k_per_batch_entry_beside_a_plain_output(server: ShoalServer) -> None:
    doc = {
        "inputs": [_ints("INPUT0", list(range(32)), [2, 16]), _ints("INPUT1", [3] * 32, [2, 16])],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"classification": 2}},
            {"name": "OUTPUT1"},
        ],
    }
    status, body = _post(server, "simple", doc)
    assert status == 200, body
    out0, out1 = json.loads(body)["outputs"]
    assert out0 == {
        "name": "OUTPUT0",
        "datatype": "BYTES",
        "shape": [2, 2],
        "data": ["18:15", "17:14", "34:15", "33:14"],
    }
    assert out1["datatype"] == "INT32" and out1["data"] == [v - 3 for v in range(32)]


def test_k_beyond_the_classes_is_capped_and_zero_is_no_classification(
    server: ShoalServer,
) -> None:
    ins = [_ints("INPUT0", [1] * 16, [1, 16]), _ints("INPUT1", [1] * 16, [1, 16])]
    top = [{"name": "OUTPUT1", "parameters": {"classification": 100}}]
    status, body = _post(server, "simple", {"inputs": ins, "outputs": top})
    out = json.loads(body)["outputs"][0]
    assert (status, out["shape"]) == (200, [1, 16])
    assert out["data"][:3] == ["0:0", "0:1", "0:2"]  # equal values: index order
    none = [{"name": "OUTPUT0", "parameters": {"classification": 0}}]
    status, body = _post(server, "simple", {"inputs": ins, "outputs": none})
    out = json.loads(body)["outputs"][0]
    assert (status, out["datatype"], out["data"]) == (200, "INT32", [2] * 16)


def _scores() -> np.ndarray:
    return np.array([[0.1, 0.9, 0.5, 0.7, 0.3]], np.float32)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_class_count_with_labels_through_tritonclient(server: ShoalServer, module: Any) -> None:
    """What image_client.py does: class_count=K, then 'value:index:label' per entry."""
    url = server.url if module is httpclient else f"127.0.0.1:{server.grpc_port}"
    client = module.InferenceServerClient(url)
    inp = module.InferInput("INPUT0", [1, 5], "FP32")
    inp.set_data_from_numpy(_scores())
    result = client.infer(
        "labelled", [inp], outputs=[module.InferRequestedOutput("OUTPUT0", class_count=4)]
    )
    classes = result.as_numpy("OUTPUT0")
    assert classes.shape == (1, 4)
    assert [c.decode() for c in classes[0]] == [
        "0.900000:1:dog",
        "0.700000:3:bird",
        "0.500000:2",  # an empty label line: no label
        "0.300000:4",  # past the last label: none
    ]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_ensemble_labels_its_classes_with_its_own_labels_else_its_step_s(
    server: ShoalServer, module: Any
) -> None:
    """Triton's ensemble label provider: the ensemble output's label_filename, else the
    labels of the step's model that produces it (L0_infer's fan_ ensembles)."""
    url = server.url if module is httpclient else f"127.0.0.1:{server.grpc_port}"
    client = module.InferenceServerClient(url)
    inp = module.InferInput("IN", [1, 5], "FP32")
    inp.set_data_from_numpy(_scores())
    asked = [module.InferRequestedOutput("OUT", class_count=3)]
    own = client.infer("relabelled", [inp], outputs=asked).as_numpy("OUT")
    assert [c.decode() for c in own[0]] == ["0.900000:1:x", "0.700000:3:z", "0.500000:2:y"]
    inherited = client.infer("inherits", [inp], outputs=asked).as_numpy("OUT")
    assert [c.decode() for c in inherited[0]] == ["0.900000:1:dog", "0.700000:3:bird", "0.500000:2"]


def test_a_model_that_does_not_batch_gets_k_strings(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    inp = grpcclient.InferInput("INPUT0", [5], "FP32")
    inp.set_data_from_numpy(_scores()[0])
    result = client.infer(
        "flat", [inp], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)]
    )
    assert result.as_numpy("OUTPUT0").tolist() == [b"0.900000:1", b"0.700000:3"]
    assert result.get_output("OUTPUT0").datatype == "BYTES"


def test_a_type_that_cannot_be_ranked_is_refused(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    inp = httpclient.InferInput("INPUT0", [1, 2], "BOOL")
    inp.set_data_from_numpy(np.array([[True, False]]))
    with pytest.raises(InferenceServerException) as e:
        client.infer(
            "booleans", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=1)]
        )
    assert e.value.status() == "400"
    assert e.value.message() == (
        "class result not available for output due to unsupported type 'BOOL'"
    )
    assert client.is_model_ready("booleans")


def test_a_label_file_that_cannot_be_read_fails_that_model_s_load(server: ShoalServer) -> None:
    version = server.model_version("unlabelled")
    assert version["state"] == "UNAVAILABLE"
    assert "failed to read labels of output 'OUTPUT0'" in version["reason"]
    assert httpclient.InferenceServerClient(server.url).is_model_ready("labelled")
