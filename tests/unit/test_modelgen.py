"""The generated ONNX models load in onnxruntime and compute what their names promise."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from tools import modelgen  # noqa: E402

NUMPY_TYPES: dict[str, type] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
ONNX_BFLOAT16 = 16


def _session(model: bytes):  # type: ignore[no-untyped-def]
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def test_simple_sum_and_difference() -> None:
    sess = _session(modelgen.simple_model())
    rng = np.random.default_rng(0)
    a = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    out0, out1 = sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    assert out0.dtype == np.int32 and out0.shape == (3, 16)
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)


def test_simple_io_signature() -> None:
    sess = _session(modelgen.simple_model())
    for arg in [*sess.get_inputs(), *sess.get_outputs()]:
        assert arg.type == "tensor(int32)"
        assert arg.shape[1] == 16 and not isinstance(arg.shape[0], int)
    assert [i.name for i in sess.get_inputs()] == ["INPUT0", "INPUT1"]
    assert [o.name for o in sess.get_outputs()] == ["OUTPUT0", "OUTPUT1"]


@pytest.mark.parametrize("datatype", [t for t in NUMPY_TYPES if t != "BOOL"])
def test_add_sub_every_numeric_type(datatype: str) -> None:
    dtype = NUMPY_TYPES[datatype]
    sess = _session(modelgen.add_sub_model(datatype))
    rng = np.random.default_rng(1)
    a = rng.integers(0, 100, (2, 16)).astype(dtype)
    b = rng.integers(0, 100, (2, 16)).astype(dtype)
    out0, out1 = sess.run(None, {"INPUT0": a, "INPUT1": b})
    with np.errstate(over="ignore"):
        # Unsigned differences wrap modulo 2**bits, as numpy's do.
        np.testing.assert_array_equal(out0, a + b)
        np.testing.assert_array_equal(out1, a - b)
    assert out0.dtype == dtype


def test_mlp_matches_numpy() -> None:
    from onnx import load_from_string, numpy_helper

    model_bytes = modelgen.mlp_model()
    weights = {
        t.name: numpy_helper.to_array(t) for t in load_from_string(model_bytes).graph.initializer
    }
    x = np.random.default_rng(2).standard_normal((4, 256)).astype(np.float32)
    (y,) = _session(model_bytes).run(None, {"INPUT0": x})
    h = np.maximum(x @ weights["w1"] + weights["b1"], 0)
    np.testing.assert_allclose(y, h @ weights["w2"] + weights["b2"], rtol=1e-4, atol=1e-4)
    assert y.shape == (4, 256) and y.dtype == np.float32


def test_models_are_deterministic() -> None:
    assert modelgen.mlp_model() == modelgen.mlp_model()
    assert modelgen.simple_model() == modelgen.simple_model()


@pytest.mark.parametrize("datatype", list(NUMPY_TYPES))
@pytest.mark.parametrize("batch", [True, False])
def test_identity_round_trip(datatype: str, batch: bool) -> None:
    sess = _session(modelgen.identity_model(datatype, [-1, 3], batch))
    shape = (2, 4, 3) if batch else (4, 3)
    x = np.arange(np.prod(shape)).reshape(shape).astype(NUMPY_TYPES[datatype])
    (y,) = sess.run(None, {"INPUT0": x})
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)


def test_identity_bytes_round_trip_arbitrary_binary() -> None:
    # onnxruntime's Python API turns a bytes element into str(b'..') and returns str elements,
    # so binary goes through latin-1, which maps each byte to one code point and back.
    sess = _session(modelgen.identity_model("BYTES", [-1], True))
    raw = [b"a", b"\x00b", b"c\xff\xfe", bytes(range(256))]
    x = np.array([[r.decode("latin-1") for r in raw]], dtype=object)
    (y,) = sess.run(None, {"INPUT0": x})
    assert [v.encode("latin-1") for v in y.ravel()] == raw


def test_identity_bf16_round_trip_through_ortvalue() -> None:
    # numpy has no bfloat16: the bits travel as uint16 tagged with the ONNX type.
    sess = _session(modelgen.identity_model("BF16", [3], True))
    x = (np.arange(6, dtype=np.uint16) + 0x3F80).reshape(2, 3)
    value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x, ONNX_BFLOAT16)
    (out,) = sess.run_with_ort_values(["OUTPUT0"], {"INPUT0": value})
    assert out.data_type() == "tensor(bfloat16)" and out.shape() == [2, 3]
    raw = (ctypes.c_char * out.tensor_size_in_bytes()).from_address(out.data_ptr())
    np.testing.assert_array_equal(np.frombuffer(bytes(raw), np.uint16).reshape(2, 3), x)


def test_unknown_datatype_rejected() -> None:
    with pytest.raises(ValueError, match="unsupported datatype"):
        modelgen.identity_model("COMPLEX64", [1], False)


def test_write_shipped_repository(tmp_path: Path) -> None:
    modelgen.write_shipped_repository(tmp_path)
    for name in ("simple", "mlp"):
        assert (tmp_path / name / "1" / "model.onnx").stat().st_size > 0
        assert f'name: "{name}"' in (tmp_path / name / "config.pbtxt").read_text()
    assert "max_batch_size: 8" in (tmp_path / "simple" / "config.pbtxt").read_text()
    assert "KIND_CPU" in (tmp_path / "mlp" / "config.pbtxt").read_text()


def test_shipped_configs_parse_as_model_config() -> None:
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    for text, name, mbs in (
        (modelgen.SIMPLE_CONFIG, "simple", 8),
        (modelgen.MLP_CONFIG, "mlp", 32),
        (modelgen.SIMPLE_SEQUENCE_CONFIG, "simple_sequence", 8),
    ):
        cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
        assert cfg.name == name and cfg.max_batch_size == mbs
        assert cfg.platform == "onnxruntime_onnx"


def test_mlp_large_graph_matches_numpy_at_small_dims() -> None:
    from onnx import load_from_string, numpy_helper

    model_bytes = modelgen.mlp_large_model(in_dim=8, hidden=16, out_dim=4)
    graph = load_from_string(model_bytes).graph
    w = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    assert [w[f"w{i}"].shape for i in (1, 2, 3)] == [(8, 16), (16, 16), (16, 4)]
    # weights scaled by 1/sqrt(fan_in): their spread is about that, not 1
    assert 0.2 < float(w["w2"].std()) * np.sqrt(16) < 2.0
    x = np.random.default_rng(3).standard_normal((5, 8)).astype(np.float32)
    (y,) = _session(model_bytes).run(None, {"INPUT0": x})
    h1 = np.maximum(x @ w["w1"] + w["b1"], 0)
    h2 = np.maximum(h1 @ w["w2"] + w["b2"], 0)
    np.testing.assert_allclose(y, h2 @ w["w3"] + w["b3"], rtol=1e-4, atol=1e-5)
    assert y.shape == (5, 4) and y.dtype == np.float32
    assert [i.name for i in _session(model_bytes).get_inputs()] == ["INPUT0"]
    assert modelgen.mlp_large_model(8, 16, 4) == model_bytes  # deterministic


def test_mlp_large_config_parses() -> None:
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    cfg = text_format.Parse(modelgen.MLP_LARGE_CONFIG, model_config_pb2.ModelConfig())
    assert cfg.name == "mlp_large" and cfg.max_batch_size == 64
    assert list(cfg.input[0].dims) == [1024] and list(cfg.output[0].dims) == [1024]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 2000
    assert cfg.instance_group[0].count == 1


def test_modelgen_writes_large_model_only_when_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def tiny() -> bytes:
        calls.append("built")
        return modelgen.mlp_large_model(8, 16, 4)

    monkeypatch.setitem(
        modelgen.SHIPPED_MODELS, "mlp_large", (tiny, modelgen.MLP_LARGE_CONFIG, False)
    )
    assert modelgen.main([str(tmp_path)]) == 0
    assert calls == ["built"]
    large = tmp_path / "mlp_large" / "1" / "model.onnx"
    first = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    large.write_bytes(b"kept")
    assert modelgen.main([str(tmp_path)]) == 0  # simple and mlp rewritten, mlp_large kept
    assert calls == ["built"] and large.read_bytes() == b"kept"
    for p, data in first.items():
        if p != large:
            assert p.read_bytes() == data
    assert modelgen.main(["--missing-only", str(tmp_path)]) == 0
    assert calls == ["built"]
    assert modelgen.main(["--force", str(tmp_path)]) == 0
    assert calls == ["built", "built"] and large.read_bytes() == first[large]
    assert modelgen.main(["--bogus"]) == 2


def test_simple_sequence_adds_one_at_start_only() -> None:
    sess = _session(modelgen.simple_sequence_model())
    ints = lambda *v: np.array([[x] for x in v], np.int32)  # noqa: E731
    (out,) = sess.run(
        None, {"INPUT": ints(5, 5, 5), "START": ints(1, 0, 1), "READY": ints(1, 1, 0)}
    )
    assert out.reshape(-1).tolist() == [6, 5, 5]  # a row not READY is not started either
