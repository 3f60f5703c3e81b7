"""TensorFlow models (tensorflow_savedmodel, tensorflow_graphdef) through the real server and
tritonclient: SavedModels made at test time, found and completed from their signature
with no config at all, signature selection (TF_SIGNATURE_DEF), string tensors, a frozen
GraphDef, and the load errors of bad models with Triton's messages."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serverctl import ShoalServer, settled_server
from tools import tfgen

# A server of many models of a heavy framework (a worker per model, each importing it)
# starts slowly on a busy 2-core host: more than the usual 120 s for the module's first test.
pytestmark = pytest.mark.timeout(300)

PAIR = (
    'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
    ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
)


def _param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def _model(repo: Path, name: str, config: str | None) -> Path:
    (repo / name / "1").mkdir(parents=True)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    return repo / name / "1"


@pytest.fixture(scope="module")
def tf_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("tf-repo")
    saved = tfgen.save_add_sub(tmp_path_factory.mktemp("saved") / "model.savedmodel")

    def savedmodel(name: str, config: str | None) -> None:
        (_model(repo, name, config) / "model.savedmodel").symlink_to(saved, True)

    savedmodel("auto", None)  # no config: found by model.savedmodel, completed from it
    doubled = 'platform: "tensorflow_savedmodel"\nmax_batch_size: 8\n' + _param(
        "TF_SIGNATURE_DEF", "doubled"
    )
    savedmodel("doubled", doubled)
    tfgen.save_strings(_model(repo, "strings", None) / "model.savedmodel")
    graphdef = 'platform: "tensorflow_graphdef"\nmax_batch_size: 8\n' + PAIR
    (_model(repo, "frozen", graphdef) / "model.graphdef").write_bytes(tfgen.frozen_add_sub())
    # Bad ones
    savedmodel("no_signature", doubled.replace('"doubled"', '"nope"'))
    savedmodel("wrong_tag", 'platform: "tensorflow_savedmodel"\n' + _param("TF_GRAPH_TAG", "gpu"))
    savedmodel("fp16", 'platform: "tensorflow_savedmodel"\nmax_batch_size: 8\n'
               + PAIR.replace("TYPE_FP32", "TYPE_FP16", 1))  # fmt: skip
    savedmodel(
        "threads", 'platform: "tensorflow_savedmodel"\n' + _param("TF_NUM_INTRA_THREADS", "-2")
    )
    # TF_INIT_OPS_FILE (its other cases: tests/unit/workers/test_tf_init_ops.py)
    scaled = (
        'platform: "tensorflow_graphdef"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    version = _model(repo, "init_ops", scaled + _param("TF_INIT_OPS_FILE", "ops.json"))
    (version / "model.graphdef").write_bytes(tfgen.scaled_graph(3.0))
    (version / "ops.json").write_text(json.dumps({"init_ops": ["init"]}))
    bad_graph = graphdef.replace('name: "INPUT1"', 'name: "Z"')
    (_model(repo, "frozen_bad", bad_graph) / "model.graphdef").write_bytes(tfgen.frozen_add_sub())
    with settled_server(repo, GOOD + BAD) as srv:
        yield srv


GOOD = ("auto", "doubled", "strings", "frozen", "init_ops")
BAD = ("no_signature", "wrong_tag", "fp16", "threads", "frozen_bad")


def _infer(srv: ShoalServer, model: str, arrays: dict[str, np.ndarray], outputs: list[str],
           protocol: str = "http") -> dict[str, np.ndarray]:  # fmt: skip
    url, module = srv.client(protocol)
    client = module.InferenceServerClient(url)
    inputs = []
    for name, arr in arrays.items():
        datatype = "BYTES" if arr.dtype == object else "FP32"
        inp = module.InferInput(name, list(arr.shape), datatype)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    try:
        result = client.infer(
            model, inputs, outputs=[module.InferRequestedOutput(o) for o in outputs]
        )
    finally:
        client.close()
    return {o: result.as_numpy(o) for o in outputs}


def test_every_good_model_loads(tf_server: ShoalServer) -> None:
    states = {m: tf_server.model_version(m) for m in GOOD}
    assert all(v["state"] == "READY" for v in states.values()), states


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_savedmodel_alone_is_found_and_completed_from_its_signature(
    tf_server: ShoalServer, protocol: str
) -> None:
    with urllib.request.urlopen(f"http://{tf_server.url}/v2/models/auto/config", timeout=5) as r:
        config = json.loads(r.read())
    assert (config["platform"], config["backend"]) == ("tensorflow_savedmodel", "tensorflow")
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [4]), ("INPUT1", "TYPE_FP32", [4]),
    ]  # fmt: skip
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((3, 4), dtype=np.float32)
    out = _infer(tf_server, "auto", {"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"], protocol)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


def test_tf_signature_def_picks_the_signature(tf_server: ShoalServer) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = _infer(tf_server, "doubled", {"INPUT0": a}, ["OUTPUT0"])
    np.testing.assert_array_equal(out["OUTPUT0"], a * 2)


def test_string_tensors_in_and_out(tf_server: ShoalServer) -> None:
    # a [batch] signature tensor: dims [1] with an empty reshape, as Triton completes it
    text = np.array([[b"abc"], [b"x\x00y"], ["\u00e9".encode()]], dtype=object)
    out = _infer(tf_server, "strings", {"TEXT": text}, ["SHOUTED", "LENGTH"], "grpc")
    assert out["SHOUTED"].reshape(-1).tolist() == [b"abc!", b"x\x00y!", "\u00e9!".encode()]
    np.testing.assert_array_equal(out["LENGTH"].reshape(-1), [3, 3, 2])


def test_a_frozen_graphdef(tf_server: ShoalServer) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = _infer(tf_server, "frozen", {"INPUT0": a, "INPUT1": a}, ["OUTPUT0"])
    np.testing.assert_array_equal(out["OUTPUT0"], a * 2)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{tf_server.grpc_port}")
    assert client.get_model_metadata("frozen", as_json=True)["platform"] == "tensorflow_graphdef"
    http = httpclient.InferenceServerClient(tf_server.url)
    assert http.is_model_ready("frozen")


def test_tf_init_ops_file_runs_its_ops_once_at_load(tf_server: ShoalServer) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    for _ in range(2):  # the variable keeps its value: the ops ran once, not per request
        out = _infer(tf_server, "init_ops", {"INPUT0": a}, ["OUTPUT0"])
        np.testing.assert_array_equal(out["OUTPUT0"], a * 3)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("no_signature", "unable to load model 'no_signature', expected 'nope' signature"),
        ("wrong_tag", "unable to load model 'wrong_tag', expected 'gpu' tag"),
        ("fp16", "configuration expects datatype TYPE_FP16 for input 'INPUT0', model "
         "provides TYPE_FP32"),
        ("threads", "parameter 'TF_NUM_INTRA_THREADS' must be non-negative number for "
         "TensorFlow model 'threads'"),
        ("frozen_bad", "unexpected inference input 'Z'"),
    ],
)  # fmt: skip
def test_a_bad_model_fails_its_load_with_the_reason(
    tf_server: ShoalServer, model: str, reason: str
) -> None:
    version = tf_server.model_version(model)
    assert version["state"] == "UNAVAILABLE"
    assert reason in version["reason"], version["reason"]
