"""TensorRT engines for tests (needs TensorRT's builder: the ``tensorrt`` package with its
libraries, on a host with a GPU; the server imports this never).

``build_plan(onnx_bytes, profiles)``: the ONNX model built into a serialized engine
(``model.plan`` bytes), with one optimization profile per ``(min, opt, max)`` batch
triple; every input gets ``[batch, *its other dims]`` in each profile (the other dims
must be fixed in the ONNX model). ``version_compatible`` builds a plan that TensorRT's
lean runtime (``tensorrt_lean``) can run.
"""

from __future__ import annotations

from collections.abc import Sequence

try:
    import tensorrt as trt
except ImportError:  # (PyPI's tensorrt-cu13-bindings wheel names the module so)
    import tensorrt_bindings as trt  # type: ignore[no-redef]


def build_plan(
    onnx_bytes: bytes, profiles: Sequence[tuple[int, int, int]], version_compatible: bool = False
) -> bytes:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise RuntimeError(f"TensorRT's ONNX parser refused the model: {errors}")
    config = builder.create_builder_config()
    if version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    for low, opt, high in profiles:
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            rest = tuple(tensor.shape)[1:]
            profile.set_shape(tensor.name, (low, *rest), (opt, *rest), (high, *rest))
        config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError("TensorRT could not build the engine")
    return bytes(plan)
