"""L0_decoupled: decoupled models over gRPC streams, alone and in ensembles.

Its test.sh serves Triton's C++ ``repeat`` and ``square`` backends (``repeat_int32``,
``square_int32``) and its ``identity`` backend (``identity_int32``), which Triton's CI
puts beside the suite's ensembles (``models/``) or as Python models (``python_models``)
before it runs. ``identity`` is built into shoal; the other two are in no source tree, so
this runner writes Python models of its own with the same behaviour at run time
(``REPEAT``, ``SQUARE`` below, as the repeat backend's documentation describes it), and
serves them with the suite's ensembles
and ``libtorch_nobatch_int32_int32_int32`` from ``gen_qa_models.py --libtorch``, and runs
the suite's trial once (test.sh's two trials, ``python`` and ``custom``, differ only in
those models).
"""

from __future__ import annotations

import os
from pathlib import Path

from triton_qa import QA, suite

SUITE = "L0_decoupled"

# IN: INT32 [-1]; DELAY: UINT32 [-1] (ms before each response); WAIT: UINT32 [1] (ms the
# request is held, which changes no response). One response per element of IN (OUT the
# element, IDX its position), then the final flag; each request on a thread of its own.
# Not decoupled (L0_decoupled's NonDecoupledTest edits the config): one response, IN[0].
REPEAT = """
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _get(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)

    def execute(self, requests):
        if not self.decoupled:
            return [self.once(r) for r in requests]
        for request in requests:
            threading.Thread(target=self.repeat, args=(request,), daemon=True).start()
        return None

    def once(self, request):
        values, delays = _get(request, "IN"), _get(request, "DELAY")
        time.sleep(int(delays[0]) / 1000 if len(delays) else 0)
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("OUT", np.array([values[0]], np.int32)),
            pb_utils.Tensor("IDX", np.array([0], np.uint32)),
        ])

    def repeat(self, request):
        sender = request.get_response_sender()
        values, delays = _get(request, "IN"), _get(request, "DELAY")
        if values.shape != delays.shape:
            a, b = (",".join(map(str, x.shape)) for x in (values, delays))
            message = f"expected IN and DELAY shape to match, got [{a}] and [{b}]"
            error = pb_utils.TritonError(message)
            sender.send(pb_utils.InferenceResponse(error=error),
                        pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        for i, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(int(delay) / 1000)
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("IDX", np.array([i], np.uint32)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
REPEAT_CONFIG = """name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [{ count: 1 kind: KIND_CPU }]
"""

# IN: INT32 [1]; IN responses, each OUT = IN, then the final flag.
SQUARE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            for _ in range(value):
                out = pb_utils.Tensor("OUT", np.array([value], np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
SQUARE_CONFIG = """name: "square_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }]
"""

_TESTS = ("test_one_to_none", "test_one_to_one", "test_one_to_many", "test_no_streaming",
          "test_response_order", "test_wrong_shape")  # fmt: skip


def _write(models: Path, name: str, source: str, config: str | None) -> None:
    (models / name / "1").mkdir(parents=True, exist_ok=True)
    (models / name / "1" / "model.py").write_text(source)
    if config is not None:
        (models / name / "config.pbtxt").write_text(config)


def _models(qa: QA, here: Path) -> Path:
    """The suite's ensembles and the models they name, as test.sh's MODELDIR has them."""
    models = qa.copy(here / "models", qa.fresh(here / "python_models"))
    _write(models, "repeat_int32", REPEAT, REPEAT_CONFIG)
    _write(models, "square_int32", SQUARE, SQUARE_CONFIG)
    # identity_int32: Triton's identity backend, built into shoal (its config as it is)
    torch = qa.copy(
        qa.generated("qa_model_repository") / "libtorch_nobatch_int32_int32_int32",
        models / "libtorch_nobatch_int32_int32_int32",
    )
    QA.sed(torch / "config.pbtxt", r"dims:.*\[.*\]", "dims: [ 1 ]")
    for model in models.iterdir():  # (the ensembles' version folders, as CI makes them)
        (model / "1").mkdir(exist_ok=True)
    return models


def _plain(qa: QA, here: Path, models: Path) -> None:
    with qa.serve(here, f"--model-repository={models}", log="decoupled") as ready:
        for name in _TESTS:
            if ready:
                qa.test(SUITE, here, "decoupled_test.py", f"DecoupledTest.{name}", note="")
            else:
                qa.not_ready(SUITE, 1, name)


def _delayed(qa: QA, here: Path, models: Path) -> None:
    delayed = {"TRITONSERVER_DELAY_GRPC_RESPONSE": "2000"}
    with qa.serve(here, f"--model-repository={models}", log="delayed", env=delayed) as ready:
        if ready:
            qa.test(SUITE, here, "decoupled_test.py", "DecoupledTest.test_one_to_multi_many",
                    **delayed)  # fmt: skip
        else:
            qa.not_ready(SUITE, 1, "test_one_to_multi_many")


def _pool(qa: QA, here: Path, models: Path) -> None:
    args = (f"--model-repository={models}", "--grpc-max-response-pool-size=1")
    with qa.serve(here, *args, log="pool_size_1") as ready:
        for name in _TESTS:
            if ready:
                qa.test(SUITE, here, "decoupled_test.py", f"DecoupledTest.{name}",
                        note="--grpc-max-response-pool-size=1")  # fmt: skip
            else:
                qa.not_ready(SUITE, 1, f"{name} --grpc-max-response-pool-size=1")


def _non_decoupled(qa: QA, here: Path, models: Path) -> None:
    plain = qa.fresh(here / "non_decoupled_models")
    qa.copy(models / "repeat_int32", plain / "repeat_int32")
    QA.sed(plain / "repeat_int32" / "config.pbtxt", "decoupled: True", "decoupled: False")
    with qa.serve(here, f"--model-repository={plain}", log="non_decoupled") as ready:
        if ready:
            qa.test(SUITE, here, "decoupled_test.py", "NonDecoupledTest", note="")
        else:
            qa.not_ready(SUITE, 4, "NonDecoupledTest")


_RUNS = {"plain": _plain, "delayed": _delayed, "pool": _pool, "non_decoupled": _non_decoupled}


@suite
def l0_decoupled(qa: QA) -> None:
    """test.sh's servers in its order; ``DECOUPLED_RUNS`` (the runner's own, not test.sh's;
    default all) names some of them: ``plain delayed pool non_decoupled``."""
    here = qa.qa / SUITE
    models = _models(qa, here)
    for run in os.environ.get("DECOUPLED_RUNS", " ".join(_RUNS)).split():
        _RUNS[run](qa, here, models)
