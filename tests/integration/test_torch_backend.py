"""The PyTorch backend (TorchScript, platform pytorch_libtorch) through the real server
and tritonclient: Triton's three ways of matching config tensors to forward(), data
types, dynamic batching, and the errors a TorchScript model brings."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, settled_server
from tools import modelgen, torchgen

# A server of many models of a heavy framework (a worker per model, each importing it)
# starts slowly on a busy 2-core host: more than the usual 120 s for the module's first test.
pytestmark = pytest.mark.timeout(300)


def _write(repo: Path, name: str, model: bytes, config: str) -> None:
    modelgen.write_model(repo, name, model, config, filename="model.pt")


def _add_sub(
    repo: Path, name: str, ins: tuple[str, str], outs: tuple[str, str], dtype: str, extra: str = ""
) -> None:
    def tensors(names: tuple[str, str]) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: TYPE_{dtype} dims: [ -1 ] }}' for n in names)

    _write(
        repo, name, torchgen.add_sub_model(),
        f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        f"input [ {tensors(ins)} ]\noutput [ {tensors(outs)} ]\n{extra}",
    )  # fmt: skip


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("torch-repo")
    # forward(INPUT0, INPUT1): config names are forward's argument names, listed in the
    # other order; outputs by <name>__<index>.
    _add_sub(
        repo, "by_argument", ("INPUT1", "INPUT0"), ("OUTPUT__0", "OUTPUT__1"), "FP32"
    )  # fmt: skip
    # Six requests make the preferred size: one execution as soon as all six are queued
    # (the long delay only matters if they are not).
    _add_sub(
        repo, "batched", ("INPUT0", "INPUT1"), ("OUTPUT__0", "OUTPUT__1"), "FP32",
        "dynamic_batching { preferred_batch_size: [ 6 ] max_queue_delay_microseconds: 10000000 }",
    )  # fmt: skip
    # <name>__<index> picks the argument position whatever the config order.
    _add_sub(repo, "by_index", ("B__1", "A__0"), ("DIFF__1", "SUM__0"), "INT64")
    # Neither: config order, for inputs and outputs.
    _add_sub(repo, "by_order", ("X", "Y"), ("S", "D"), "FP16")
    _add_sub(repo, "bf16", ("INPUT0", "INPUT1"), ("OUTPUT__0", "OUTPUT__1"), "BF16")
    _write(
        repo, "crash", torchgen.crash_model(),
        'name: "crash"\nplatform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n',
    )  # fmt: skip
    _write(  # a TorchScript model cannot complete its own config
        repo, "no_io", torchgen.add_sub_model(),
        'name: "no_io"\nplatform: "pytorch_libtorch"\nmax_batch_size: 4\n',
    )  # fmt: skip
    _write(  # forward takes two tensors, the config lists one
        repo, "one_input", torchgen.add_sub_model(),
        'name: "one_input"\nplatform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n',
    )  # fmt: skip
    _write(  # forward returns one FP32 tensor: the config's two outputs are both wrong
        repo, "one_tensor", torchgen.crash_model(),
        'name: "one_tensor"\nplatform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP64 dims: [ 2 ] },'
        ' { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 2 ] } ]\n',
    )  # fmt: skip
    _write(
        repo, "dict_input", torchgen.dict_add_model(),
        'name: "dict_input"\nplatform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        'input [ { name: "B" data_type: TYPE_INT32 dims: [ 2 ] },'
        ' { name: "A" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
        'output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 2 ] } ]\n',
    )  # fmt: skip
    _write(  # one output row per batch, whatever its size; a pair is a full batch
        repo, "sum_rows", torchgen.sum_rows_model(),
        'name: "sum_rows"\nplatform: "pytorch_libtorch"\nmax_batch_size: 2\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 10000000 }\n",
    )  # fmt: skip
    _write(  # TYPE_STRING: forward takes and returns List[str] (its other cases:
        # tests/unit/workers/test_torch_strings.py)
        repo, "strings", torchgen.shout_model(),
        'name: "strings"\nplatform: "pytorch_libtorch"\n'
        'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] },'
        ' { name: "SCALE" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        'output [ { name: "SHOUTED" data_type: TYPE_STRING dims: [ -1 ] },'
        ' { name: "LENGTH" data_type: TYPE_INT64 dims: [ -1 ] } ]\n',
    )  # fmt: skip
    with settled_server(repo, MODELS) as srv:
        yield srv


MODELS = (
    "by_argument", "batched", "by_index", "by_order", "bf16", "crash", "no_io", "one_input",
    "one_tensor", "dict_input", "sum_rows", "strings",
)  # fmt: skip


def _infer_http(
    srv: ShoalServer, model: str, arrays: dict[str, np.ndarray], dtype: str
) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(srv.url)
    inputs = []
    for name, arr in arrays.items():
        inp = httpclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr, binary_data=True)
        inputs.append(inp)
    try:
        result = client.infer(model, inputs)
    finally:
        client.close()  # in this thread: gevent's hub cannot close it from another
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def test_inputs_matched_by_forward_argument_name(torch_server: ShoalServer) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 10, dtype=np.float32)
    out = _infer_http(torch_server, "by_argument", {"INPUT0": a, "INPUT1": b}, "FP32")
    np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT__1"], a - b)  # INPUT0 - INPUT1, not reversed


def test_inputs_and_outputs_matched_by_index(torch_server: ShoalServer) -> None:
    a = np.array([[5, 7, 9]], dtype=np.int64)
    b = np.array([[1, 2, 3]], dtype=np.int64)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{torch_server.grpc_port}")
    inputs = []
    for name, arr in (("A__0", a), ("B__1", b)):
        inp = grpcclient.InferInput(name, list(arr.shape), "INT64")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    result = client.infer("by_index", inputs)
    np.testing.assert_array_equal(result.as_numpy("SUM__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("DIFF__1"), a - b)


def test_config_order_when_names_follow_no_convention(torch_server: ShoalServer) -> None:
    x = np.array([[1.5, -2.0]], dtype=np.float16)
    y = np.array([[0.25, 4.0]], dtype=np.float16)
    out = _infer_http(torch_server, "by_order", {"X": x, "Y": y}, "FP16")
    np.testing.assert_array_equal(out["S"], x + y)
    np.testing.assert_array_equal(out["D"], x - y)
    assert out["S"].dtype == np.float16


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_inputs_and_outputs_are_lists_of_str(
    torch_server: ShoalServer, protocol: str
) -> None:
    url, module = torch_server.client(protocol)
    client = module.InferenceServerClient(url)
    text = np.array([b"ab", b"x\x00y", "\u00e9".encode()], dtype=object)
    inputs = [module.InferInput("TEXT", [3], "BYTES"), module.InferInput("SCALE", [1], "INT64")]
    inputs[0].set_data_from_numpy(text)
    inputs[1].set_data_from_numpy(np.array([10], dtype=np.int64))
    try:
        result = client.infer("strings", inputs)
        # TorchScript's str is bytes: upper() is ASCII's, len() counts UTF-8 bytes
        assert result.as_numpy("SHOUTED").tolist() == [b"AB!", b"X\x00Y!", "\u00e9!".encode()]
        assert result.as_numpy("LENGTH").tolist() == [20, 30, 20]
        bad = module.InferInput("TEXT", [1], "BYTES")
        bad.set_data_from_numpy(np.array([b"\xff"], dtype=object))
        with pytest.raises(InferenceServerException, match="not valid UTF-8"):
            client.infer("strings", [bad, inputs[1]])
    finally:
        client.close()


def test_bf16_round_trip(torch_server: ShoalServer) -> None:
    a = np.array([[1.5, -3.0, 0.125]], dtype=ml_dtypes.bfloat16)
    b = np.array([[0.5, 1.0, 2.0]], dtype=ml_dtypes.bfloat16)
    out = _infer_http(torch_server, "bf16", {"INPUT0": a, "INPUT1": b}, "BF16")
    got = np.asarray(out["OUTPUT__0"]).view(np.uint16).view(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got.astype(np.float32), (a + b).astype(np.float32))


def test_concurrent_requests_are_batched_and_answered_each_their_own(
    torch_server: ShoalServer,
) -> None:
    def one(i: int) -> tuple[int, dict[str, np.ndarray]]:
        a = np.full((1, 4), i, dtype=np.float32)
        return i, _infer_http(
            torch_server, "batched", {"INPUT0": a, "INPUT1": np.ones_like(a)}, "FP32"
        )

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    for i, out in results:
        np.testing.assert_array_equal(out["OUTPUT__0"], np.full((1, 4), i + 1, np.float32))
        np.testing.assert_array_equal(out["OUTPUT__1"], np.full((1, 4), i - 1, np.float32))
    with urllib.request.urlopen(
        f"http://{torch_server.url}/v2/models/batched/stats", timeout=5
    ) as r:
        stats = json.loads(r.read())["model_stats"][0]
    assert stats["inference_count"] == 6
    assert stats["execution_count"] == 1  # all six in one batch


def test_an_exception_in_forward_fails_that_request_only(torch_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(torch_server.url)
    bad = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    bad.set_data_from_numpy(np.array([[1.0, -1.0]], dtype=np.float32))
    with pytest.raises(InferenceServerException, match="negative input") as e:
        client.infer("crash", [bad])
    assert e.value.status() == "500"
    assert "PyTorch execute failure" in e.value.message()
    good = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    good.set_data_from_numpy(np.array([[1.0, 3.0]], dtype=np.float32))
    np.testing.assert_array_equal(client.infer("crash", [good]).as_numpy("OUTPUT__0"), [[2.0, 6.0]])


def test_a_config_without_tensors_fails_to_load_with_the_reason(
    torch_server: ShoalServer,
) -> None:
    client = httpclient.InferenceServerClient(torch_server.url)
    assert not client.is_model_ready("no_io")
    version = torch_server.model_version("no_io")
    assert version["state"] == "UNAVAILABLE"
    assert "must list every input and output" in version["reason"]
    assert client.is_model_ready("by_order")  # the others are unaffected


def test_a_config_with_fewer_inputs_than_forward_fails_to_load(
    torch_server: ShoalServer,
) -> None:
    version = torch_server.model_version("one_input")
    assert version["state"] == "UNAVAILABLE"
    assert "configuration expects 1 inputs, model provides 2" in version["reason"]


def test_outputs_must_exist_and_have_their_config_datatype(torch_server: ShoalServer) -> None:
    """A lone tensor is output 0 only (not every output), and its dtype is checked."""
    client = httpclient.InferenceServerClient(torch_server.url)
    inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.array([[1.0, 3.0]], dtype=np.float32))
    for output, message in (
        ("OUTPUT__1", "refers to an output index which doesn't exist. This model has 1 outputs"),
        (
            "OUTPUT__0",
            "expects datatype TYPE_FP64 for output 'OUTPUT__0', model provides TYPE_FP32",
        ),
    ):
        out = httpclient.InferRequestedOutput(output)
        with pytest.raises(InferenceServerException, match=message) as e:
            client.infer("one_tensor", [inp], outputs=[out])
        assert e.value.status() == "400"


def test_a_dict_argument_gets_every_input_by_name(torch_server: ShoalServer) -> None:
    a = np.array([[1, 2], [3, 4]], dtype=np.int32)
    b = np.array([[10, 20], [30, 40]], dtype=np.int32)
    out = _infer_http(torch_server, "dict_input", {"A": a, "B": b}, "INT32")
    np.testing.assert_array_equal(out["SUM"], a + b)


def test_an_output_that_cannot_be_split_fails_its_batch_and_the_worker_lives(
    torch_server: ShoalServer,
) -> None:
    """Two requests batched together, but the model answers one row for both: each gets
    an error naming the output, and the instance goes on serving."""

    def one(i: int) -> str:
        client = httpclient.InferenceServerClient(torch_server.url)
        inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        inp.set_data_from_numpy(np.full((1, 2), i, dtype=np.float32))
        try:
            client.infer("sum_rows", [inp])
        except InferenceServerException as exc:
            return f"{exc.status()} {exc.message()}"
        finally:
            client.close()  # in this thread: gevent's hub cannot close it from another
        return "ok"

    pid = torch_server.worker_pid("sum_rows")
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(one, range(2)))
    for answer in answers:
        assert answer.startswith("500 "), answers
        assert "output 'OUTPUT__0' has shape [1, 2], but the batch holds 2 samples" in answer
    assert torch_server.worker_pid("sum_rows") == pid  # the same process serves on
    assert httpclient.InferenceServerClient(torch_server.url).is_model_ready("sum_rows")
