"""The suites ``scripts/triton_qa.py`` runs: each one the Python parts of a Triton
``qa/L0_*/test.sh``, with the same model copies, edits and server flags, in order.

What a suite leaves out (C++ clients, GPU-only parts, custom C++ backends, valgrind) is
said in docs/triton-qa.md.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from triton_qa import QA, suite


@suite
def l0_http(qa: QA) -> None:
    here = qa.suite("L0_http")
    identity = qa.generated("qa_identity_model_repository")
    models = qa.fresh(here / "python_unit_test_models")
    for name in ("onnx_zero_1_float32", "onnx_zero_1_object", "onnx_zero_1_float16"):
        qa.copy(identity / name, models / name)
    qa.copy(identity / "onnx_zero_3_float32", models / "onnx_zero_3_float32")
    one = qa.copy(models / "onnx_zero_1_object", models / "onnx_zero_1_object_1_element")
    qa.sed(one / "config.pbtxt", "onnx_zero_1_object", "onnx_zero_1_object_1_element")
    qa.sed(one / "config.pbtxt", "-1", "1", count=1)
    queue = qa.copy(models / "onnx_zero_1_float32", models / "onnx_zero_1_float32_queue")
    qa.sed(queue / "config.pbtxt", "onnx_zero_1_float32", "onnx_zero_1_float32_queue")
    with (queue / "config.pbtxt").open("a") as f:
        f.write(
            "dynamic_batching { \n    max_queue_delay_microseconds: 1000000\n"
            "    preferred_batch_size: [ 8 ]\n    default_queue_policy {\n"
            "        max_queue_size: 1\n    }\n}\n"
        )
    qa.copy(here / "models" / "simple_identity", models / "simple_identity")
    i64 = qa.copy(here / "models" / "simple_identity", models / "simple_identity_int64")
    qa.sed(i64 / "config.pbtxt", "TYPE_STRING", "TYPE_INT64")
    qa.sed(i64 / "config.pbtxt", "simple_identity", "simple_identity_int64")
    args = (f"--model-repository={models}", "--model-control-mode=explicit", "--load-model=*")
    with qa.serve(here, *args, log="http_test") as ready:
        if ready:
            qa.test("L0_http", here, "http_test.py")
        else:
            qa.not_ready("L0_http", 17, "http_test.py")
    generate = qa.qa / "python_models" / "generate_models"
    args = (f"--model-repository={generate}", "--log-verbose=1")
    with qa.serve(here, *args, log="generate") as ready:
        if ready:
            qa.test("L0_http", here, "generate_endpoint_test.py")
        else:
            qa.not_ready("L0_http", 18, "generate_endpoint_test.py")


@suite
def l0_grpc(qa: QA) -> None:
    here = qa.suite("L0_grpc")
    models = qa.fresh(here / "grpc_test_models")
    qa.copy(here / "models" / "simple", models / "simple")
    identity = qa.copy(qa.qa / "python_models" / "string_identity", models / "string_identity")
    (identity / "1").mkdir(exist_ok=True)
    shutil.move(identity / "model.py", identity / "1" / "model.py")
    qa.sed(identity / "config.pbtxt", r"dims: \[ 1 \]", "dims: [ -1 ]")
    args = (f"--model-repository={models}", "--allow-client-shm=true")
    with qa.serve(here, *args, log="grpc_test") as ready:
        if ready:
            qa.test("L0_grpc", here, "python_unit_test.py", "GrpcTest")
        else:
            qa.not_ready("L0_grpc", 2, "python_unit_test.py GrpcTest")


_SHM_TESTS = [
    "test_invalid_create_shm",
    "test_valid_create_set_register",
    "test_unregister_before_register",
    "test_unregister_after_register",
    "test_reregister_after_register",
    "test_unregister_after_inference",
    "test_register_after_inference",
    "test_too_big_shm",
    "test_mixed_raw_shm",
    "test_unregisterall",
    "test_infer_offset_out_of_bound",
    "test_infer_byte_size_out_of_bound",
    "test_infer_integer_overflow",
    "test_register_out_of_bound",
    "test_register_reserved_names",
    "test_register_invalid_shm_key",
    "test_python_client_leak",
]
_SHM_DURING = [
    "test_unregister_shm_during_inference_single_req",
    "test_unregister_shm_during_inference_multiple_req",
    "test_unregister_shm_after_inference",
]


def _shm_case(qa: QA, here: Path, models: Path, case: str, *extra: str, **env: str) -> None:
    """One shared_memory_test.py case as test.sh runs it: a fresh server per client type;
    TestSharedMemoryUnregister's cases are named per client type (``<case>_<client>``)."""
    for client in ("http", "grpc"):
        args = (f"--model-repository={models}", "--log-verbose=1", *extra)
        name = (
            f"TestSharedMemoryUnregister.{case}_{client}"
            if case in _SHM_DURING
            else f"SharedMemoryTest.{case}"
        )
        qa.served_test(
            "L0_shared_memory", here, args, "shared_memory_test.py", name,
            log=f"{case}.{client}", what=f"{case} {client}",
            test_env={"CLIENT_TYPE": client, **env},
        )  # fmt: skip


@suite
def l0_shared_memory(qa: QA) -> None:
    here = qa.suite("L0_shared_memory")
    models = here / "models"
    _shm_case(qa, here, models, "test_client_shm_disabled_by_default")
    for case in _SHM_TESTS:
        _shm_case(qa, here, models, case, "--allow-client-shm=true")
    delayed = qa.fresh(here / "python_models") / "simple"
    qa.copy(qa.qa / "python_models" / "execute_delayed_model", delayed)
    (delayed / "1").mkdir(exist_ok=True)
    shutil.move(delayed / "model.py", delayed / "1" / "model.py")
    for case in _SHM_DURING:
        _shm_case(qa, here, delayed.parent, case, "--allow-client-shm=true")
    models = qa.fresh(here / "models")
    add_sub = qa.copy(qa.qa / "python_models" / "add_sub", models / "python_int32_int32_int32")
    (add_sub / "1").mkdir(exist_ok=True)
    shutil.move(add_sub / "model.py", add_sub / "1" / "model.py")
    qa.sed(add_sub / "config.pbtxt", "TYPE_FP32", "TYPE_INT32")
    with (add_sub / "config.pbtxt").open("a") as f:
        f.write("max_batch_size: 8\n")  # (test.sh's echo)
    # test.sh copies version 1 alone (versions 2 and 3 swap the sum and the difference)
    onnx = qa.generated("qa_model_repository") / "onnx_int32_int32_int32"
    qa.copy(onnx / "1", models / onnx.name / "1")
    for name in ("config.pbtxt", "output0_labels.txt"):
        shutil.copy(onnx / name, models / onnx.name)
    # (the backends whose models are there: test.sh's BACKENDS, which the test reads)
    case = "test_large_shm_register_offset"
    _shm_case(qa, here, models, case, "--allow-client-shm=true", BACKENDS="python onnx")


def _infer_models(qa: QA, here: Path, ensembles: bool) -> Path:
    """test.sh's generate_model_repository for BACKENDS="onnx python" on CPU: the ONNX
    models, Python ones made from their configs, and with ``ensembles`` the generated
    ONNX ensembles, their ``nop_*`` steps and the suite's ``ensemble_models`` (Triton's
    identity backend, built into shoal, serves the nop and ``custom_*`` models)."""
    data = qa.generated("qa_model_repository")
    models = qa.fresh(here / "models")
    swap = {f"python{b}_{t}_{t}_{t}" for t in ("float32", "int32", "int16", "int8")
            for b in ("", "_nobatch")}  # fmt: skip
    for onnx in sorted(data.glob("onnx_*")):
        if "bf16" in onnx.name:
            continue
        name = onnx.name.replace("onnx", "python")
        (models / name / "1").mkdir(parents=True)
        text = re.sub(r"platform:.*", "", (onnx / "config.pbtxt").read_text())
        text = re.sub(r"version_policy.*", 'backend: "python"', text)
        (models / name / "config.pbtxt").write_text(text.replace("onnx", "python"))
        shutil.copy(onnx / "output0_labels.txt", models / name)
        source = "sub_add" if name in swap else "add_sub"
        shutil.copy(qa.qa / "python_models" / source / "model.py", models / name / "1")
    for onnx in sorted(data.glob("onnx*")):
        if "bf16" not in onnx.name:
            qa.copy(onnx, models / onnx.name)
    if ensembles:
        generated = qa.generated("qa_ensemble_model_repository/qa_model_repository")
        for model in sorted(generated.iterdir()):
            if "onnx" in model.name or model.name.startswith("nop_"):
                qa.copy(model, models / model.name)
        for nop in models.glob("nop_*"):  # (util.sh's create_nop_version_dir)
            (nop / "1").mkdir(exist_ok=True)
        for name in _INFER_ENSEMBLES:
            qa.copy(qa.qa / "ensemble_models" / name, models / name)
            (models / name / "1").mkdir(exist_ok=True)
    for config in [*models.glob("onnx*/config.pbtxt"), *models.glob("python*/config.pbtxt")]:
        with config.open("a") as f:
            f.write("instance_group [ { kind: KIND_CPU }]\n")
    custom = qa.copy(qa.qa / "custom_models" / "custom_zero_1_float32", models / _CUSTOM)
    (custom / "1").mkdir(exist_ok=True)
    with (custom / "config.pbtxt").open("a") as f:
        f.write("instance_group [ { kind: KIND_CPU }]\n")
    nobatch = qa.copy(custom, models / "custom_nobatch_zero_1_float32")
    qa.sed(custom / "config.pbtxt", "max_batch_size: 1", "max_batch_size: 8", count=1)
    qa.sed(custom / "config.pbtxt", r"dims: \[ 1 \]", "dims: [ -1 ]")
    config = nobatch / "config.pbtxt"
    qa.sed(config, _CUSTOM, "custom_nobatch_zero_1_float32", count=1)
    qa.sed(config, "max_batch_size: 1", "max_batch_size: 0", count=1)
    qa.sed(config, r"dims: \[ 1 \]", "dims: [ -1, -1 ]")
    return models


_CUSTOM = "custom_zero_1_float32"
#: test.sh's ENSEMBLE_MODELS where BACKENDS has onnx and not libtorch
_INFER_ENSEMBLES = [
    "wrong_label_int32_float32_float32",
    "label_override_int32_float32_float32",
    "mix_type_int32_float32_float32",
    "batch_to_nobatch_float32_float32_float32",
    "batch_to_nobatch_nobatch_float32_float32_float32",
    "nobatch_to_batch_float32_float32_float32",
    "nobatch_to_batch_nobatch_float32_float32_float32",
    "mix_nobatch_batch_float32_float32_float32",
]


@suite
def l0_infer(qa: QA) -> None:
    here = qa.suite("L0_infer")
    ensembles = os.environ.get("ENSEMBLES", "1")
    models = _infer_models(qa, here, ensembles == "1")
    env = {"BACKENDS": "onnx python", "ENSEMBLES": ensembles, "TRITON_SERVER_CPU_ONLY": "1"}
    for shm in ("0", "1"):
        args = [f"--model-repository={models}", "--exit-timeout-secs=120"]
        if shm == "1":
            args.append("--allow-client-shm=true")
        with qa.serve(here, *args, log=f"infer.shm{shm}") as ready:
            if ready:
                qa.test("L0_infer", here, "infer_test.py", **env, TEST_SYSTEM_SHARED_MEMORY=shm)
            else:
                qa.not_ready("L0_infer", 1, f"infer_test.py TEST_SYSTEM_SHARED_MEMORY={shm}")
