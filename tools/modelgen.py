"""Builds the small ONNX models shoal ships and tests with, and writes Triton repositories.

Every builder returns the serialized ModelProto as ``bytes``; the graphs are built with
``onnx.helper`` only, and random weights come from a fixed seed, so regenerating a model gives
byte-identical files. ``onnx`` is a development dependency: it is imported inside the builders.

``python -m tools.modelgen [REPO]`` regenerates the repository shipped in ``model_repository/``
(``simple``, Triton's example model, and ``mlp``, the benchmark model) and writes ``mlp_large``
(the batching benchmark's model, about 96 MB, not committed) only when its ``model.onnx`` is
missing; ``--missing-only`` leaves every existing ``model.onnx`` alone, ``--force`` rewrites
``mlp_large`` too. Configs are always rewritten.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np

OPSET = 17
# IR 8 is what opset 17 was released with; every onnxruntime since 1.12 loads it.
IR_VERSION = 8
SEED = 20240611

# Triton v2 datatype name -> onnx.TensorProto enum name.
ONNX_TYPE_NAMES: dict[str, str] = {
    "BOOL": "BOOL",
    "UINT8": "UINT8",
    "UINT16": "UINT16",
    "UINT32": "UINT32",
    "UINT64": "UINT64",
    "INT8": "INT8",
    "INT16": "INT16",
    "INT32": "INT32",
    "INT64": "INT64",
    "FP16": "FLOAT16",
    "FP32": "FLOAT",
    "FP64": "DOUBLE",
    "BF16": "BFLOAT16",
    "BYTES": "STRING",
}

# Types whose add/sub runs through a cast to a wider type (onnxruntime's CPU Add/Sub kernels
# cover only float, double, int32, int64 and a few more).
_COMPUTE_TYPE: dict[str, str] = {
    "UINT8": "INT32",
    "UINT16": "INT32",
    "UINT32": "INT64",
    "INT8": "INT32",
    "INT16": "INT32",
    "FP16": "FP32",
    "BF16": "FP32",
}


def _onnx_type(datatype: str) -> int:
    from onnx import TensorProto

    try:
        return int(getattr(TensorProto, ONNX_TYPE_NAMES[datatype]))
    except KeyError:
        raise ValueError(f"unsupported datatype {datatype!r}") from None


def _finish(graph: Any) -> bytes:
    from onnx import checker, helper

    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="tools.modelgen",
    )
    model.ir_version = IR_VERSION
    checker.check_model(model)
    return bytes(model.SerializeToString())


def _io(name: str, datatype: str, shape: list[int | str | None]) -> Any:
    from onnx import helper

    return helper.make_tensor_value_info(name, _onnx_type(datatype), shape)


def add_sub_model(datatype: str = "INT32", dim: int = 16) -> bytes:
    """Triton's ``simple`` layout for ``datatype``: OUTPUT0 = IN0 + IN1, OUTPUT1 = IN0 - IN1.

    Inputs INPUT0, INPUT1 and outputs OUTPUT0, OUTPUT1 are all ``[-1, dim]``. Types onnxruntime
    cannot add natively are cast to a wider type and back, like Triton's ``simple_int8``;
    unsigned results wrap around modulo 2**bits as they do in numpy.
    """
    from onnx import helper

    if datatype in ("BOOL", "BYTES"):
        raise ValueError(f"add/sub is not defined for {datatype}")
    shape: list[int | str | None] = ["batch", dim]
    compute = _COMPUTE_TYPE.get(datatype, datatype)
    nodes = []
    a, b = "INPUT0", "INPUT1"
    if compute != datatype:
        nodes += [
            helper.make_node("Cast", ["INPUT0"], ["in0_c"], to=_onnx_type(compute)),
            helper.make_node("Cast", ["INPUT1"], ["in1_c"], to=_onnx_type(compute)),
        ]
        a, b = "in0_c", "in1_c"
    for op, out in (("Add", "OUTPUT0"), ("Sub", "OUTPUT1")):
        if compute == datatype:
            nodes.append(helper.make_node(op, [a, b], [out]))
        else:
            wrapped = f"{out}_c"
            nodes.append(helper.make_node(op, [a, b], [wrapped]))
            if datatype.startswith("UINT"):
                # Cast from a wider signed int to a narrower unsigned one saturates or is
                # undefined for negatives; a modulo first keeps numpy's wrap-around semantics.
                bits = {"UINT8": 8, "UINT16": 16, "UINT32": 32}[datatype]
                modulus = f"{out}_mod"
                nodes.append(
                    helper.make_node(
                        "Constant",
                        [],
                        [modulus],
                        value=helper.make_tensor(modulus, _onnx_type(compute), [], [1 << bits]),
                    )
                )
                nodes.append(helper.make_node("Mod", [wrapped, modulus], [f"{out}_w"], fmod=0))
                wrapped = f"{out}_w"
            nodes.append(helper.make_node("Cast", [wrapped], [out], to=_onnx_type(datatype)))
    graph = helper.make_graph(
        nodes,
        f"add_sub_{datatype.lower()}",
        [_io("INPUT0", datatype, shape), _io("INPUT1", datatype, shape)],
        [_io("OUTPUT0", datatype, shape), _io("OUTPUT1", datatype, shape)],
    )
    return _finish(graph)


def simple_model() -> bytes:
    """Triton's ``simple``: INT32 ``[-1, 16]`` inputs INPUT0/INPUT1, sum and difference out."""
    return add_sub_model("INT32", 16)


def mlp_model(in_dim: int = 256, hidden: int = 1024, out_dim: int = 256) -> bytes:
    """FP32 ``[-1, in_dim]`` -> Gemm(hidden) -> Relu -> Gemm(out_dim), INPUT0 -> OUTPUT0.

    Weights are standard normal scaled by 1/sqrt(fan_in), biases small normal; seed fixed.
    """
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(SEED)

    def init(name: str, shape: tuple[int, ...], scale: float) -> Any:
        arr = (rng.standard_normal(shape) * scale).astype(np.float32)
        return numpy_helper.from_array(arr, name)

    inits = [
        init("w1", (in_dim, hidden), 1.0 / np.sqrt(in_dim)),
        init("b1", (hidden,), 0.01),
        init("w2", (hidden, out_dim), 1.0 / np.sqrt(hidden)),
        init("b2", (out_dim,), 0.01),
    ]
    nodes = [
        helper.make_node("Gemm", ["INPUT0", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["h_relu"]),
        helper.make_node("Gemm", ["h_relu", "w2", "b2"], ["OUTPUT0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [_io("INPUT0", "FP32", ["batch", in_dim])],
        [_io("OUTPUT0", "FP32", ["batch", out_dim])],
        initializer=inits,
    )
    return _finish(graph)


def mlp_large_model(
    in_dim: int = 1024, hidden: int = 4096, out_dim: int = 1024, seed: int = SEED + 1
) -> bytes:
    """FP32 ``[-1, in_dim]`` -> Gemm(hidden) -> Relu -> Gemm(hidden) -> Relu -> Gemm(out_dim).

    INPUT0 -> OUTPUT0; weights w1..w3 standard normal scaled by 1/sqrt(fan_in), biases b1..b3
    small normal, all from ``seed``. At the default sizes the file is about 96 MB (24M FP32
    weights): a compute-bound model, slow enough at batch 1 that batching pays.
    """
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    dims = [in_dim, hidden, hidden, out_dim]
    inits: list[Any] = []
    nodes: list[Any] = []
    x = "INPUT0"
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(dims), start=1):
        w = rng.standard_normal((fan_in, fan_out), dtype=np.float32) * np.float32(
            1.0 / np.sqrt(fan_in)
        )
        b = rng.standard_normal((fan_out,), dtype=np.float32) * np.float32(0.01)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(dims) - 1
        y = "OUTPUT0" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y]))
        if not last:
            nodes.append(helper.make_node("Relu", [y], [f"h{i}_relu"]))
            x = f"h{i}_relu"
    graph = helper.make_graph(
        nodes,
        "mlp_large",
        [_io("INPUT0", "FP32", ["batch", in_dim])],
        [_io("OUTPUT0", "FP32", ["batch", out_dim])],
        initializer=inits,
    )
    return _finish(graph)


def string_upper_model() -> bytes:
    """BYTES ``[-1]`` INPUT0 -> OUTPUT0 upper-cased, by onnxruntime-extensions' custom
    StringUpper: a model that runs only once that library is registered
    (``model_operations { op_library_filename }``)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("StringUpper", ["INPUT0"], ["OUTPUT0"], domain="ai.onnx.contrib")],
        "string_upper",
        [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, [None])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, [None])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.onnx.contrib", 1)],
        producer_name="tools.modelgen",
    )
    model.ir_version = IR_VERSION  # no checker: it knows no custom domain
    return bytes(model.SerializeToString())


def identity_model(datatype: str, dims: list[int], batch: bool) -> bytes:
    """ONNX Identity INPUT0 -> OUTPUT0 for a Triton v2 datatype (BYTES is ONNX STRING).

    ``dims`` may hold -1 for a variable dimension; ``batch`` prepends a variable batch dim.
    """
    from onnx import helper

    shape: list[int | str | None] = [f"d{i}" if d == -1 else d for i, d in enumerate(dims)]
    if batch:
        shape = ["batch", *shape]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        f"identity_{datatype.lower()}",
        [_io("INPUT0", datatype, shape)],
        [_io("OUTPUT0", datatype, shape)],
    )
    return _finish(graph)


def ragged_sum_model() -> bytes:
    """A model for Triton's ragged batching: the batch's FP32 requests come flattened in
    INPUT0 ``[-1]``, with two batch inputs: INDEX (INT32 ``[-1]``, where each request ends:
    BATCH_ACCUMULATED_ELEMENT_COUNT) and COUNT (FP32 ``[-1]``, each request's element
    count: BATCH_ELEMENT_COUNT).

    Outputs: SUM ``[-1, 1]`` each request's sum (a difference of the cumulative sum at the
    request's bounds), LENGTH ``[-1, 1]`` its element count, and DOUBLED ``[-1]`` (INPUT0
    times 2, ragged too: scattered back by the input's shapes, BATCH_SCATTER_WITH_INPUT_SHAPE).
    """
    from onnx import TensorProto, helper

    def const(name: str, dtype: int, dims: list[int], values: list[Any]) -> Any:
        return helper.make_node(
            "Constant", [], [name], value=helper.make_tensor(name, dtype, dims, values)
        )

    nodes = [
        const("zero_f", TensorProto.FLOAT, [1], [0.0]),
        const("zero_i", TensorProto.INT64, [1], [0]),
        const("minus_one", TensorProto.INT64, [1], [-1]),
        const("axis0", TensorProto.INT64, [], [0]),
        const("axis1", TensorProto.INT64, [1], [1]),
        const("two", TensorProto.FLOAT, [], [2.0]),
        # running[i]: the sum of the first i elements; a request's sum is
        # running[its end] - running[its start]
        helper.make_node("CumSum", ["INPUT0", "axis0"], ["cumsum"]),
        helper.make_node("Concat", ["zero_f", "cumsum"], ["running"], axis=0),
        helper.make_node("Cast", ["INDEX"], ["ends"], to=TensorProto.INT64),
        helper.make_node("Slice", ["ends", "zero_i", "minus_one"], ["ends_but_last"]),
        helper.make_node("Concat", ["zero_i", "ends_but_last"], ["starts"], axis=0),
        helper.make_node("Gather", ["running", "ends"], ["at_end"], axis=0),
        helper.make_node("Gather", ["running", "starts"], ["at_start"], axis=0),
        helper.make_node("Sub", ["at_end", "at_start"], ["sums"]),
        helper.make_node("Unsqueeze", ["sums", "axis1"], ["SUM"]),
        helper.make_node("Unsqueeze", ["COUNT", "axis1"], ["LENGTH"]),
        helper.make_node("Mul", ["INPUT0", "two"], ["DOUBLED"]),
    ]
    inputs = [_io("INPUT0", "FP32", ["n"]), _io("INDEX", "INT32", ["b"])]
    inputs.append(_io("COUNT", "FP32", ["b"]))
    outputs = [_io("SUM", "FP32", ["b", 1]), _io("LENGTH", "FP32", ["b", 1])]
    outputs.append(_io("DOUBLED", "FP32", ["n"]))
    graph = helper.make_graph(nodes, "ragged_sum", inputs, outputs)
    return _finish(graph)


def accumulate_model(batch: bool = True, corrid: str = "UINT64") -> bytes:
    """A stateful model for Triton's sequence batcher, with implicit state: each sequence
    keeps a running INT32 sum. OUTPUT = (0 at START, else INPUT_STATE) + INPUT x READY,
    and OUTPUT_STATE (the state the next request of the sequence is fed) is the same.

    Inputs: INPUT and the control tensors START, END, READY (INT32) and CORRID (``corrid``:
    a v2 datatype, BYTES for string ids), then the state INPUT_STATE (INT32), all
    ``[-1, 1]`` (``[1]`` without ``batch``). Outputs: OUTPUT, OUTPUT_STATE, and the
    control values as the model saw them, for tests: START_OUT, END_OUT, READY_OUT,
    CORRID_OUT.
    """
    from onnx import TensorProto, helper

    shape: list[int | str | None] = ["batch", 1] if batch else [1]
    nodes = [
        helper.make_node(
            "Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT32, [], [0])
        ),
        helper.make_node("Cast", ["START"], ["starting"], to=TensorProto.BOOL),
        helper.make_node("Where", ["starting", "zero", "INPUT_STATE"], ["base"]),
        helper.make_node("Mul", ["INPUT", "READY"], ["added"]),
        helper.make_node("Add", ["base", "added"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"]),
    ]
    nodes += [
        helper.make_node("Identity", [name], [f"{name}_OUT"])
        for name in ("START", "END", "READY", "CORRID")
    ]
    inputs = [_io(name, "INT32", shape) for name in ("INPUT", "START", "END", "READY")]
    inputs += [_io("CORRID", corrid, shape), _io("INPUT_STATE", "INT32", shape)]
    outputs = [_io(name, "INT32", shape) for name in ("OUTPUT", "OUTPUT_STATE")]
    outputs += [_io(f"{name}_OUT", "INT32", shape) for name in ("START", "END", "READY")]
    outputs.append(_io("CORRID_OUT", corrid, shape))
    return _finish(helper.make_graph(nodes, "accumulate", inputs, outputs))


def simple_sequence_model() -> bytes:
    """Triton's ``simple_sequence`` example, as its clients (``simple_*_sequence_*_client.py``)
    expect it: INT32 INPUT ``[-1, 1]`` and the controls START and READY (INT32, [0, 1]);
    OUTPUT = INPUT + START, so a sequence's first answer is its input plus one and the
    others are their input."""
    from onnx import helper

    shape: list[int | str | None] = ["batch", 1]
    nodes = [
        helper.make_node("Mul", ["START", "READY"], ["started"]),
        helper.make_node("Add", ["INPUT", "started"], ["OUTPUT"]),
    ]
    inputs = [_io(name, "INT32", shape) for name in ("INPUT", "START", "READY")]
    graph = helper.make_graph(nodes, "simple_sequence", inputs, [_io("OUTPUT", "INT32", shape)])
    return _finish(graph)


RAGGED_SUM_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ -1 ]
    allow_ragged_batch: true
  }}
]
batch_input [
  {{
    kind: BATCH_ACCUMULATED_ELEMENT_COUNT
    target_name: "INDEX"
    data_type: TYPE_INT32
    source_input: "INPUT0"
  }},
  {{
    kind: BATCH_ELEMENT_COUNT
    target_name: "COUNT"
    data_type: TYPE_FP32
    source_input: "INPUT0"
  }}
]
output [
  {{
    name: "SUM"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }},
  {{
    name: "LENGTH"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }},
  {{
    name: "DOUBLED"
    data_type: TYPE_FP32
    dims: [ -1 ]
  }}
]
batch_output [
  {{
    target_name: "DOUBLED"
    kind: BATCH_SCATTER_WITH_INPUT_SHAPE
    source_input: "INPUT0"
  }}
]
{extra}"""
"""Config of `ragged_sum_model` (``.format(name=..., extra=...)``: ``extra`` may add a
scheduler, e.g. ``dynamic_batching { ... }``)."""


ACCUMULATE_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "START_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "END_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "READY_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "CORRID_OUT" data_type: {corrid} dims: [ 1 ] }}
]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }}
  ]
  state [
    {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] }}
  ]
  {strategy}
}}
{extra}"""
"""Config of `accumulate_model` (``.format(name=, max_batch_size=, corrid= TYPE_UINT64 or
TYPE_STRING, idle_us=, strategy= e.g. ``direct { }`` or ``oldest { ... }``, extra=)``)."""

SIMPLE_CONFIG = """\
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
"""

SIMPLE_SEQUENCE_CONFIG = """\
name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
output [
  {
    name: "OUTPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    {
      name: "START"
      control [
        {
          kind: CONTROL_SEQUENCE_START
          int32_false_true: [ 0, 1 ]
        }
      ]
    },
    {
      name: "READY"
      control [
        {
          kind: CONTROL_SEQUENCE_READY
          int32_false_true: [ 0, 1 ]
        }
      ]
    }
  ]
}
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
"""

MLP_CONFIG = """\
name: "mlp"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 256 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 256 ]
  }
]
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
"""

MLP_LARGE_CONFIG = """\
name: "mlp_large"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 1024 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 1024 ]
  }
]
dynamic_batching {
  max_queue_delay_microseconds: 2000
}
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
"""


def write_model(
    repo: Path,
    name: str,
    model_bytes: bytes,
    config_text: str | None,
    version: int = 1,
    filename: str = "model.onnx",
) -> Path:
    """Write ``<repo>/<name>/<version>/<filename>`` and, if given,
    ``<repo>/<name>/config.pbtxt``.

    Returns the model directory. Existing files are overwritten.
    """
    model_dir = Path(repo) / name
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / filename).write_bytes(model_bytes)
    if config_text is not None:
        (model_dir / "config.pbtxt").write_text(config_text)
    return model_dir


#: The shipped models: name -> (builder, config, cheap). A model that is not cheap (large,
#: slow to build, not committed) is written only when its file is missing, unless forced.
SHIPPED_MODELS: dict[str, tuple[Any, str, bool]] = {
    "simple": (simple_model, SIMPLE_CONFIG, True),
    "simple_sequence": (simple_sequence_model, SIMPLE_SEQUENCE_CONFIG, True),
    "mlp": (mlp_model, MLP_CONFIG, True),
    "mlp_large": (mlp_large_model, MLP_LARGE_CONFIG, False),
}


def write_shipped_repository(
    repo: Path,
    models: tuple[str, ...] = ("simple", "mlp"),
    missing_only: bool = False,
    force: bool = False,
) -> list[str]:
    """Regenerate the repository shipped with shoal (by default ``simple`` and ``mlp``).

    Each config is written; a ``model.onnx`` is written unless it exists and either
    ``missing_only`` is set or the model is a large one (and ``force`` is not set).
    Returns the names whose ``model.onnx`` was written.
    """
    written = []
    for name in models:
        build, config, cheap = SHIPPED_MODELS[name]
        onnx_path = Path(repo) / name / "1" / "model.onnx"
        skip = onnx_path.exists() and (missing_only or not (cheap or force))
        if skip:
            (Path(repo) / name / "config.pbtxt").write_text(config)
            continue
        write_model(repo, name, build(), config)
        written.append(name)
    return written


USAGE = """\
usage: python -m tools.modelgen [--missing-only | --force] [REPO]
  REPO            default: model_repository/ in the repository root
  (default)       rewrite simple and mlp; write mlp_large only if its model.onnx is missing
  --missing-only  write no model.onnx that already exists
  --force         rewrite mlp_large's model.onnx too"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    flags = {a for a in args if a.startswith("-")}
    rest = [a for a in args if not a.startswith("-")]
    if len(rest) > 1 or flags - {"--missing-only", "--force"} or len(flags) > 1:
        print(USAGE, file=sys.stderr)
        return 2
    repo = Path(rest[0]) if rest else Path(__file__).resolve().parent.parent / "model_repository"
    written = write_shipped_repository(
        repo,
        tuple(SHIPPED_MODELS),
        missing_only="--missing-only" in flags,
        force="--force" in flags,
    )
    kept = [n for n in SHIPPED_MODELS if n not in written]
    print(
        f"wrote {', '.join(written) or 'no model'} to {repo}"
        + (f" (kept the existing {', '.join(kept)})" if kept else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
