"""PyTorch 2 archives (model.pt2: torch.export's ExportedProgram, AOTInductor's package;
platform torch_aoti) and Triton's PyTorch switches through the real server and
tritonclient: Triton's two ways of naming a PT2 archive's tensors (INPUT__<i>, and paths
into the call specification: ARGS[0], ARGS[1][k], KWARGS[scale], RESULT[pair][1]), a
model.pt2 found without a platform, dynamic batches, INFERENCE_MODE, and the load errors
of bad archives and configs."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, settled_server
from tools import modelgen, torchgen

# A server of many models of a heavy framework (a worker per model, each importing it)
# starts slowly on a busy 2-core host: more than the usual 120 s for the module's first test.
pytestmark = pytest.mark.timeout(300)


def _tensors(kind: str, names: list[str], dims: str) -> str:
    entries = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ {dims} ] }}' for n in names)
    return f"{kind} [ {entries} ]\n"


def _add_sub(ins: list[str], outs: list[str], extra: str = "") -> str:
    return (
        'platform: "torch_aoti"\nmax_batch_size: 8\n'
        + _tensors("input", ins, "4")
        + _tensors("output", outs, "4")
        + extra
    )


def _write(repo: Path, name: str, model: bytes, config: str, filename: str = "model.pt2") -> None:
    modelgen.write_model(repo, name, model, f'name: "{name}"\n{config}', filename=filename)


def _param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


@pytest.fixture(scope="module")
def pt2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("pt2-repo")
    dynamic, fixed = torchgen.exported_add_sub(), torchgen.exported_add_sub(dynamic_batch=False)
    _write(repo, "ordinal", dynamic, _add_sub(["INPUT__0", "INPUT__1"], ["OUTPUT__0", "OUTPUT__1"]))
    # the same archive found by its file alone: no platform, no backend in the config
    _write(repo, "detected", dynamic, _add_sub(["ARGS[0]", "ARGS[1]"], ["RESULT[1]"]).replace(
        'platform: "torch_aoti"\n', ""))  # fmt: skip
    nested = (
        'platform: "torch_aoti"\nmax_batch_size: 8\n'
        + _tensors("input", ["KWARGS[scale]", "ARGS[0]", "ARGS[1][k]"], "3")
        + _tensors("output", ["RESULT[pair][1]", "RESULT[sum]"], "3")
    )
    _write(repo, "nested", torchgen.exported_nested(), nested)
    _write(repo, "fixed_batch", fixed, _add_sub(["INPUT__0", "INPUT__1"], ["OUTPUT__0"]))
    aoti = torchgen.aoti_add_sub(tmp_path_factory.mktemp("aoti"))
    _write(repo, "aoti", aoti, _add_sub(["INPUT__0", "INPUT__1"], ["OUTPUT__0", "OUTPUT__1"]))
    grad = (
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        + _tensors("input", ["INPUT0"], "2")
        + _tensors("output", ["OUTPUT__0"], "2")
    )
    _write(repo, "inference_mode", torchgen.grad_model(), grad, "model.pt")
    _write(repo, "no_inference_mode", torchgen.grad_model(),
           grad + _param("INFERENCE_MODE", "false") + _param("DISABLE_OPTIMIZED_EXECUTION", "true")
           + _param("ENABLE_JIT_PROFILING", "false"), "model.pt")  # fmt: skip
    # Bad ones
    _write(repo, "unknown_input", dynamic, _add_sub(["X", "INPUT__1"], ["OUTPUT__0"]))
    _write(repo, "unknown_output", dynamic, _add_sub(["INPUT__0", "INPUT__1"], ["OUTPUT__2"]))
    _write(repo, "named_twice", dynamic, _add_sub(["INPUT__0", "ARGS[0]"], ["OUTPUT__0"]))
    _write(repo, "not_an_archive", b"not a zip", _add_sub(["INPUT__0", "INPUT__1"], ["OUTPUT__0"]))
    _write(repo, "bad_switch", torchgen.grad_model(), grad + _param("INFERENCE_MODE", "maybe"),
           "model.pt")  # fmt: skip
    with settled_server(repo, GOOD + BAD) as srv:
        yield srv


GOOD = (
    "ordinal", "detected", "nested", "fixed_batch", "aoti", "inference_mode",
    "no_inference_mode",
)  # fmt: skip
BAD = ("unknown_input", "unknown_output", "named_twice", "not_an_archive", "bad_switch")


def _infer(
    srv: ShoalServer, model: str, arrays: dict[str, np.ndarray], outputs: list[str]
) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(srv.url)
    inputs = []
    for name, arr in arrays.items():
        inp = httpclient.InferInput(name, list(arr.shape), "FP32")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    try:
        result = client.infer(
            model, inputs, outputs=[httpclient.InferRequestedOutput(o) for o in outputs]
        )
    finally:
        client.close()  # in this thread: gevent's hub cannot close it from another
    return {o: result.as_numpy(o) for o in outputs}


def _ab(n: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
    return a, np.full((n, 4), 10, dtype=np.float32)


def test_every_good_model_loads(pt2_server: ShoalServer) -> None:
    states = {m: pt2_server.model_version(m) for m in GOOD}
    assert all(v["state"] == "READY" for v in states.values()), states


@pytest.mark.parametrize("model", ["ordinal", "aoti"])
def test_ordinal_names_any_batch(pt2_server: ShoalServer, model: str) -> None:
    for n in (1, 3):
        a, b = _ab(n)
        out = _infer(pt2_server, model, {"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__0", "OUTPUT__1"])
        np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT__1"], a - b)


def test_a_model_pt2_alone_is_a_torch_aoti_model(pt2_server: ShoalServer) -> None:
    a, b = _ab(2)
    out = _infer(pt2_server, "detected", {"ARGS[0]": a, "ARGS[1]": b}, ["RESULT[1]"])
    np.testing.assert_array_equal(out["RESULT[1]"], a - b)
    status, body = pt2_server.http("/v2/models/detected")
    assert status == 200 and b'"platform":"torch_aoti"' in body.replace(b" ", b"")


def test_paths_into_args_kwargs_and_the_result(pt2_server: ShoalServer) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    k, scale = x * 10, np.full((2, 3), 2, dtype=np.float32)
    out = _infer(
        pt2_server, "nested", {"ARGS[0]": x, "ARGS[1][k]": k, "KWARGS[scale]": scale},
        ["RESULT[sum]", "RESULT[pair][1]"],
    )  # fmt: skip
    np.testing.assert_array_equal(out["RESULT[sum]"], x + k)
    np.testing.assert_array_equal(out["RESULT[pair][1]"], k - x)


def test_concurrent_requests_each_get_their_own_answer(pt2_server: ShoalServer) -> None:
    def one(i: int) -> tuple[int, dict[str, np.ndarray]]:
        a = np.full((1, 4), i, dtype=np.float32)
        return i, _infer(pt2_server, "ordinal", {"INPUT__0": a, "INPUT__1": a}, ["OUTPUT__0"])

    with ThreadPoolExecutor(6) as pool:
        for i, out in pool.map(one, range(6)):
            np.testing.assert_array_equal(out["OUTPUT__0"], np.full((1, 4), 2 * i))


def test_a_batch_the_export_fixed_fails_that_request(pt2_server: ShoalServer) -> None:
    a, b = _ab(2)
    good = _infer(pt2_server, "fixed_batch", {"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__0"])
    np.testing.assert_array_equal(good["OUTPUT__0"], a + b)
    a, b = _ab(3)
    with pytest.raises(InferenceServerException, match="PyTorch execute failure") as e:
        _infer(pt2_server, "fixed_batch", {"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__0"])
    assert e.value.status() == "500"


def test_inference_mode_is_tritons_switch(pt2_server: ShoalServer) -> None:
    x = np.ones((1, 2), dtype=np.float32)
    on = _infer(pt2_server, "inference_mode", {"INPUT0": x}, ["OUTPUT__0"])["OUTPUT__0"]
    off = _infer(pt2_server, "no_inference_mode", {"INPUT0": x}, ["OUTPUT__0"])["OUTPUT__0"]
    np.testing.assert_array_equal(on, [[1, 1]])  # Triton's default: inference mode
    np.testing.assert_array_equal(off, [[0, 0]])


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("unknown_input", "unexpected inference input 'X', allowed inputs are: ARGS[0] "
         "(INPUT__0), ARGS[1] (INPUT__1)"),
        ("unknown_output", "The output OUTPUT__2 in the model configuration refers to an "
         "output which doesn't exist"),
        ("named_twice", "no configuration input for ARGS[1]"),
        ("not_an_archive", "model.pt2 is neither an ExportedProgram nor an AOTInductor "
         "package"),
        ("bad_switch", "failed to convert 'maybe' to boolean"),
    ],
)  # fmt: skip
def test_a_bad_model_fails_its_load_with_the_reason(
    pt2_server: ShoalServer, model: str, reason: str
) -> None:
    version = pt2_server.model_version(model)
    assert version["state"] == "UNAVAILABLE"
    assert reason in version["reason"], version["reason"]
