"""L0_batcher, as its Triton ``test.sh`` runs it: the dynamic batcher's tests over
``<backend>_float32_float32_float32`` models (fixed and variable shapes) and the ragged
``onnx_zero_1_float32``, a fresh server per test, ``TRITONSERVER_DELAY_SCHEDULER`` where
test.sh sets it.

``BACKENDS`` (test.sh's, read from the environment) defaults to ``"onnx python"``. Its
``custom_zero_1_float32`` (``qa/custom_models``) and ``dynamic_batch`` models name
Triton's ``identity`` backend, which shoal has built in: they are served as test.sh
writes them (the ragged trial, max_queue_delay_only, preserve_ordering with its trace
timestamps, queue_timeout_test). Left out: the ``instance_queue_test`` unit binary (core's
C++); docs/triton-qa.md says so.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from triton_qa import QA, suite

_NO_DELAY = (
    "test_static_batch_preferred test_static_batch_lt_any_preferred "
    "test_static_batch_not_preferred test_static_batch_gt_max_preferred "
    "test_multi_batch_not_preferred test_multi_batch_gt_max_preferred "
    "test_multi_batch_sum_gt_max_preferred test_multi_same_output0 test_multi_same_output1 "
    "test_multi_different_outputs test_multi_different_output_order"
)
#: test.sh's TRITONSERVER_DELAY_SCHEDULER per test
_DELAY = {
    "test_multi_batch_delayed_sum_gt_max_preferred": 2,
    "test_multi_batch_use_biggest_preferred": 6,
    "test_multi_batch_use_best_preferred": 3,
    "test_multi_batch_delayed_use_max_batch": 3,
}
_DIFFERENT_SHAPE = (
    "test_multi_batch_not_preferred_different_shape test_multi_batch_preferred_different_shape "
    "test_multi_batch_different_shape_allow_ragged test_multi_batch_different_shape"
)
_PREFERRED_ONLY = {
    "test_preferred_batch_only_aligned": 4,
    "test_preferred_batch_only_unaligned": 5,
    "test_preferred_batch_only_use_biggest_preferred": 7,
    "test_preferred_batch_only_use_no_preferred_size": 3,
}
_DYNAMIC = (
    "dynamic_batching { preferred_batch_size: [ 2, 6 ], max_queue_delay_microseconds: 10000000 }"
)


def _has_gpu() -> bool:
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def _float32_model(qa: QA, repo: str, backend: str, dest: Path, dynamic: str) -> Path:
    """test.sh's copy of ``<backend>_float32_float32_float32`` (a Python one: the ONNX
    model's config with python_models/add_sub), with its edits and ``dynamic``."""
    data = qa.generated(repo)
    onnx = data / "onnx_float32_float32_float32"
    name = f"{backend}_float32_float32_float32"
    if backend == "python":
        (dest / name / "1").mkdir(parents=True)
        text = re.sub(r"platform:.*", 'backend: "python"', (onnx / "config.pbtxt").read_text())
        (dest / name / "config.pbtxt").write_text(text.replace("onnx", "python"))
        shutil.copy(onnx / "output0_labels.txt", dest / name)
        shutil.copy(qa.qa / "python_models" / "add_sub" / "model.py", dest / name / "1")
    else:
        qa.copy(data / name, dest / name)
    config = dest / name / "config.pbtxt"
    QA.sed(config, r"^max_batch_size:.*", "max_batch_size: 8")
    QA.sed(config, r"^version_policy:.*", "version_policy: { specific { versions: [1] }}")
    if not _has_gpu():
        QA.sed(config, "KIND_GPU", "KIND_CPU")
    with config.open("a") as f:
        f.write(dynamic + "\n")
    return config


_CUSTOM = "custom_zero_1_float32"


def _custom(qa: QA, dest: Path, max_batch: int, extra: str) -> Path:
    """test.sh's copy of ``../custom_models/custom_zero_1_float32`` (Triton's identity
    backend) into ``dest``: a version folder, ``dims: [ -1 ]``, its ``max_batch_size``,
    ``extra`` appended; its config."""
    model = qa.copy(qa.qa / "custom_models" / _CUSTOM, dest / _CUSTOM)
    (model / "1").mkdir(exist_ok=True)
    config = model / "config.pbtxt"
    QA.sed(config, r"dims:.*\[.*\]", "dims: [ -1 ]")
    QA.sed(config, r"^max_batch_size:.*", f"max_batch_size: {max_batch}")
    with config.open("a") as f:
        f.write(extra)
    if not _has_gpu():
        QA.sed(config, "KIND_GPU", "KIND_CPU")
    return config


def _repositories(qa: QA, here: Path, backends: list[str]) -> None:
    models = qa.fresh(here / "models")
    preferred = qa.fresh(here / "preferred_batch_only_models")
    var = qa.fresh(here / "var_models")
    for backend in backends:
        _float32_model(qa, "qa_model_repository", backend, models, _DYNAMIC)
        _float32_model(
            qa,
            "qa_model_repository",
            backend,
            preferred,
            "dynamic_batching { preferred_batch_size: [ 4, 6 ] }",
        )
        _float32_model(qa, "qa_variable_model_repository", backend, var, _DYNAMIC)
    for config in var.glob("*/config.pbtxt"):
        QA.sed(config, "16", "-1")
    ragged_custom = _custom(
        qa, var, 8, f"instance_group [ {{ kind: KIND_GPU count: 1 }}]\n{_DYNAMIC}\n"
    )
    QA.sed(ragged_custom, 'name:.*"INPUT0"', 'name: "INPUT0"\nallow_ragged_batch: true')
    if "onnx" in backends:
        ragged = qa.copy(
            qa.generated("qa_identity_model_repository") / "onnx_nobatch_zero_1_float32",
            var / "onnx_zero_1_float32",
        )
        config = ragged / "config.pbtxt"
        QA.sed(config, "nobatch_", "", count=1)
        QA.sed(config, r"^max_batch_size:.*", "max_batch_size: 8")
        QA.sed(config, 'name: "INPUT0"', 'name: "INPUT0"\nallow_ragged_batch: true')
        if not _has_gpu():
            QA.sed(config, "KIND_GPU", "KIND_CPU")
        with config.open("a") as f:
            f.write(
                'batch_output [{target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
                f'source_input: "INPUT0" }}] {_DYNAMIC}\n'
            )


def _run(qa: QA, here: Path, models: str, test: str, env: dict[str, str]) -> None:
    qa.served_test(
        "L0_batcher", here, [f"--model-repository={here / models}"], "batcher_test.py",
        f"BatcherTest.{test}", log=f"{test}.{models}", what=f"{test} {models}", note=models,
        serve_env=env, test_env=env,
    )  # fmt: skip


@suite
def l0_batcher(qa: QA) -> None:
    here = qa.suite("L0_batcher")
    backends = os.environ.get("BACKENDS", "onnx python").split()
    _repositories(qa, here, backends)
    base = {"BACKENDS": " ".join(backends), "TEST_SYSTEM_SHARED_MEMORY": "0"}
    for batcher, models in (("FIXED", "models"), ("VARIABLE", "var_models")):
        env = {**base, "BATCHER_TYPE": batcher}
        for test in os.environ.get("NO_DELAY_TESTS", _NO_DELAY).split():
            _run(qa, here, models, test, env)
        for test in os.environ.get("DELAY_TESTS", " ".join(_DELAY)).split():
            _run(qa, here, models, test, {**env, "TRITONSERVER_DELAY_SCHEDULER": str(_DELAY[test])})
    env = {**base, "BATCHER_TYPE": "VARIABLE"}
    for test in os.environ.get("DIFFERENT_SHAPE_TESTS", _DIFFERENT_SHAPE).split():
        _run(qa, here, "var_models", test, env)
    delayed = {**env, "TRITONSERVER_DELAY_SCHEDULER": "4"}
    _run(qa, here, "var_models", "test_multi_batch_delayed_preferred_different_shape", delayed)
    env = {**base, "BATCHER_TYPE": "FIXED"}
    for test in os.environ.get("PREFERRED_BATCH_ONLY_TESTS", " ".join(_PREFERRED_ONLY)).split():
        delay = {"TRITONSERVER_DELAY_SCHEDULER": str(_PREFERRED_ONLY[test])}
        _run(qa, here, "preferred_batch_only_models", test, {**env, **delay})
    _max_queue_delay_only(qa, here, {**base, "BATCHER_TYPE": "FIXED"})
    _preserve_ordering(qa, here, {**base, "BATCHER_TYPE": "FIXED"})
    _queue_timeout(qa, here)


def _delay_parameters(*params: tuple[str, str]) -> str:
    items = ",\n".join(f'{{ key: "{k}"; value: {{ string_value: "{v}" }}}}' for k, v in params)
    return f"parameters [\n{items}\n]\n"


def _max_queue_delay_only(qa: QA, here: Path, env: dict[str, str]) -> None:
    """The max_queue_delay_only tests over custom_zero_1_float32 with a 100 ms execute
    delay (test.sh's sed of its queue delay matches nothing: it stays 0)."""
    models = qa.fresh(here / "custom_models")
    _custom(
        qa, models, 100,
        "dynamic_batching { max_queue_delay_microseconds: 0}\n"
        "instance_group [ { kind: KIND_GPU } ]\n" + _delay_parameters(("execute_delay_ms", "100")),
    )  # fmt: skip
    tests = "test_max_queue_delay_only_default test_max_queue_delay_only_non_default"
    for test in os.environ.get("MAX_QUEUE_DELAY_ONLY_TESTS", tests).split():
        delay = "20000" if test == "test_max_queue_delay_only_non_default" else "0"
        _run(qa, here, "custom_models", test, {**env, "MAX_QUEUE_DELAY_MICROSECONDS": delay})


def _preserve_ordering(qa: QA, here: Path, env: dict[str, str]) -> None:
    """test_multi_batch_preserve_ordering over two custom_zero_1_float32 instances (100 and
    400 ms), without and with preserve_ordering, each server tracing every request; then
    verify_timestamps.py over its trace file, one check each."""
    models = qa.fresh(here / "custom_models")
    config = _custom(
        qa, models, 4,
        "dynamic_batching { preferred_batch_size: [ 4 ] }\n"
        "instance_group [ { kind: KIND_GPU count: 2 }]\n"
        + _delay_parameters(("execute_delay_ms", "100"), ("instance_wise_delay_multiplier", "4")),
    )  # fmt: skip
    delayed = {**env, "TRITONSERVER_DELAY_SCHEDULER": "12"}
    for run, flag in (("not_preserve", ()), ("preserve", ("-p",))):
        if run == "preserve":
            QA.sed(
                config,
                "dynamic_batching.*",
                "dynamic_batching { preferred_batch_size: [ 4 ] preserve_ordering: true }",
            )
        trace = here / f"{run}.log"
        args = [f"--trace-file={trace}", "--trace-level=MIN", "--trace-rate=1",
                f"--model-repository={models}"]  # fmt: skip
        test = "BatcherTest.test_multi_batch_preserve_ordering"
        qa.served_test(
            "L0_batcher", here, args, "batcher_test.py", test, log=f"{run}.server",
            what=f"test_multi_batch_preserve_ordering {run}", note=run, serve_env=delayed,
            test_env=delayed,
        )  # fmt: skip
        verify = qa.run_check(here, ["verify_timestamps.py", *flag, trace.name])
        qa.count("L0_batcher", int(verify), 1, f"verify_timestamps.py {' '.join(flag)} {run}.log")


_QUEUE_TIMEOUT = """backend: "identity"
max_batch_size: 1
input [{ name: "INPUT0"
 data_type: TYPE_FP32
 dims: [ -1 ] }]
output [{ name: "OUTPUT0"
 data_type: TYPE_FP32
 dims: [ -1 ] }]
instance_group [{ count: 1
 kind: KIND_CPU }]
dynamic_batching {
  preferred_batch_size: [ 1 ]
  default_queue_policy { timeout_action: REJECT
 default_timeout_microseconds: 1000000
 max_queue_size: 8 }
}
parameters [{ key: "execute_delay_ms"
 value: { string_value: "8000" } }]
"""


def _queue_timeout(qa: QA, here: Path) -> None:
    """queue_timeout_test.py over test.sh's ``dynamic_batch`` (identity, 8 s per batch,
    a 1 s queue timeout that rejects)."""
    models = qa.fresh(here / "models")
    (models / "dynamic_batch" / "1").mkdir(parents=True)
    (models / "dynamic_batch" / "config.pbtxt").write_text(_QUEUE_TIMEOUT)
    args = [f"--model-repository={models}", "--log-verbose=2"]
    with qa.serve(here, *args, log="queue_timeout_test") as ready:
        if ready:
            qa.test("L0_batcher", here, "queue_timeout_test.py", note="")
        else:
            qa.not_ready("L0_batcher", 1, "queue_timeout_test.py")
    qa.not_run("L0_batcher", 1, "instance_queue_test", "a C++ unit test of Triton's core")
