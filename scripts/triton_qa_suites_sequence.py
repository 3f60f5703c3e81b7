"""The sequence-batcher suites ``scripts/triton_qa.py`` runs: L0_sequence_batcher and
L0_sequence_corrid_batcher, each the Python parts of its Triton ``test.sh``, with the same
model copies, edits, server flags and environment, in order.

As test.sh, L0_sequence_batcher reads from the environment which backends, model trials
and tests to run (``BACKENDS``, ``MODEL_TRIALS``, ``NO_DELAY_TESTS``, ``DELAY_TESTS``,
``QUEUE_DELAY_TESTS``, ``IMPLICIT_STATE``); the defaults here are what shoal serves on
a CPU host: ``BACKENDS="onnx python"`` (``onnx`` with ``IMPLICIT_STATE=1``: the Python
model keeps no implicit state), no ensembles (their ``nop`` models use Triton's
``identity`` backend).

On a host without a GPU the generated configs' ``KIND_GPU`` instance groups become
``KIND_CPU`` (tritonserver would refuse to load them there, as shoal does).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from triton_qa import QA, suite

_NO_DELAY = (
    "test_simple_sequence test_length1_sequence test_batch_size test_no_sequence_start "
    "test_no_sequence_start2 test_no_sequence_end test_no_correlation_id"
)
_DELAY = (
    "test_backlog_fill test_backlog_fill_no_end test_backlog_same_correlation_id "
    "test_backlog_same_correlation_id_no_end test_backlog_sequence_timeout test_half_batch "
    "test_skip_batch test_full_batch test_ragged_batch test_backlog"
)
_QUEUE_DELAY = (
    "test_queue_delay_no_min_util test_queue_delay_half_min_util test_queue_delay_full_min_util"
)

#: test.sh's TRITONSERVER_BACKLOG_DELAY_SCHEDULER and TRITONSERVER_DELAY_SCHEDULER per
#: delay test (the others: 0 and 12).
_BACKLOG_DELAY = {
    "test_backlog_fill_no_end": 3,
    "test_backlog_fill": 2,
    "test_backlog_same_correlation_id": 2,
}
_DELAY_COUNT = {
    "test_backlog_fill_no_end": 10,
    "test_backlog_fill": 10,
    "test_backlog_same_correlation_id_no_end": 16,
    "test_half_batch": 8,
    "test_backlog_sequence_timeout": 4,
}


def _cpu_only(config: Path) -> None:
    """KIND_GPU instance groups as KIND_CPU, on a host without a GPU."""
    if not _has_gpu():
        QA.sed(config, "KIND_GPU", "KIND_CPU")


def _has_gpu() -> bool:
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def _edit(config: Path, max_batch: int | None, count: int, direct: bool = False) -> None:
    """test.sh's seds: max_batch_size, the instance count, a Direct queue delay."""
    _cpu_only(config)
    if max_batch is not None:
        QA.sed(config, r"^max_batch_size:.*", f"max_batch_size: {max_batch}")
    QA.sed(config, r"kind: KIND_(GPU|CPU)", rf"kind: KIND_\1\ncount: {count}")
    if direct:
        QA.sed(
            config,
            r"sequence_batching \{",
            "sequence_batching {\ndirect {\nmax_queue_delay_microseconds: 3000000\n"
            "minimum_slot_utilization: 0\n}",
        )


def _model(qa: QA, source: Path, dest: Path) -> Path:
    """``cp -r`` of a generated model into ``dest``, or test.sh's generate_python_models
    for a ``python_*`` one: the ONNX model's config as a Python model's, and
    python_models/sequence_int32's model.py."""
    name = source.name
    if "python" not in name:
        return qa.copy(source, dest / name)
    onnx = source.parent / name.replace("python", "onnx")
    (dest / name / "1").mkdir(parents=True, exist_ok=True)
    text = re.sub(r"platform:.*", 'backend: "python"', (onnx / "config.pbtxt").read_text())
    (dest / name / "config.pbtxt").write_text(text.replace("onnx", "python"))
    shutil.copy(qa.qa / "python_models" / "sequence_int32" / "model.py", dest / name / "1")
    return dest / name


def _dtypes(backend: str, implicit: bool) -> list[str]:
    return ["object", "int32", "bool"] if implicit and backend == "onnx" else ["int32", "bool"]


def _repositories(qa: QA, here: Path, backends: list[str], implicit: bool) -> None:
    """models0, 1, 2, 4, v and queue_delay_models, as test.sh sets them up."""
    fixed = qa.generated(
        "qa_sequence_implicit_model_repository" if implicit else "qa_sequence_model_repository"
    )
    var = qa.generated(
        "qa_variable_sequence_implicit_model_repository"
        if implicit
        else "qa_variable_sequence_model_repository"
    )
    repos = {k: qa.fresh(here / f"models{k}") for k in ("0", "1", "2", "4", "v")}
    queue = qa.fresh(here / "queue_delay_models")
    for backend in backends:
        for dtype in _dtypes(backend, implicit):
            source = fixed / f"{backend}_sequence_{dtype}"
            for k, (mbs, count) in {"1": (4, 1), "2": (2, 2), "4": (1, 4)}.items():
                _edit(_model(qa, source, repos[k]) / "config.pbtxt", mbs, count)
            delayed = _model(qa, source, queue)
            _edit(delayed / "config.pbtxt", 4, 1, direct=True)
            for suffix, utilization in (("_half", "0.5"), ("_full", "1")):
                copy = qa.copy(delayed, queue / f"{delayed.name}{suffix}")
                QA.sed(copy / "config.pbtxt", delayed.name, copy.name, count=1)
                QA.sed(
                    copy / "config.pbtxt",
                    "minimum_slot_utilization: 0",
                    f"minimum_slot_utilization: {utilization}",
                    count=1,
                )
            nobatch = fixed / f"{backend}_nobatch_sequence_{dtype}"
            _edit(_model(qa, nobatch, repos["0"]) / "config.pbtxt", None, 4)
            _edit(
                _model(qa, var / f"{backend}_sequence_{dtype}", repos["v"]) / "config.pbtxt", 4, 1
            )


def _words(name: str, default: str) -> list[str]:
    return os.environ.get(name, default).split()


def _run(qa: QA, here: Path, models: str, test: str, env: dict[str, str]) -> None:
    qa.served_test(
        "L0_sequence_batcher", here, [f"--model-repository={here / models}", "--log-verbose=1"],
        "sequence_batcher_test.py", test, log=f"{test}.{models}", what=f"{test} {models}",
        note=models, serve_env=env, test_env=env,
    )  # fmt: skip


@suite
def l0_sequence_batcher(qa: QA) -> None:
    here = qa.suite("L0_sequence_batcher")
    implicit = os.environ.get("IMPLICIT_STATE", "0") == "1"
    backends = _words("BACKENDS", "onnx" if implicit else "onnx python")
    _repositories(qa, here, backends, implicit)
    base = {
        "BACKENDS": " ".join(backends),
        "ENSEMBLES": "0",
        "IMPLICIT_STATE": "1" if implicit else "0",
        "INITIAL_STATE_FILE": "0",
        "INITIAL_STATE_ZERO": "0",
        "USE_SINGLE_BUFFER": "0",
        "TEST_SYSTEM_SHARED_MEMORY": "0",
        "TEST_CUDA_SHARED_MEMORY": "0",
    }
    for trial in _words("MODEL_TRIALS", "0 1 2 4 v"):
        env = {
            **base,
            "NO_BATCHING": "1" if trial == "0" else "0",
            "MODEL_INSTANCES": {"v": "1", "0": "4"}.get(trial, trial),
            "BATCHER_TYPE": "VARIABLE" if trial == "v" else "FIXED",
        }
        for test in _words("NO_DELAY_TESTS", _NO_DELAY):
            _run(qa, here, f"models{trial}", f"SequenceBatcherTest.{test}", env)
        for test in _words("DELAY_TESTS", _DELAY):
            delay = {
                "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": str(_BACKLOG_DELAY.get(test, 0)),
                "TRITONSERVER_DELAY_SCHEDULER": str(_DELAY_COUNT.get(test, 12)),
            }
            _run(qa, here, f"models{trial}", f"SequenceBatcherTest.{test}", {**env, **delay})
    # (after the trials test.sh's MODEL_INSTANCES and BATCHER_TYPE are the last trial's: v)
    env = {**base, "NO_BATCHING": "0", "MODEL_INSTANCES": "1", "BATCHER_TYPE": "VARIABLE"}
    delay = {"TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "0", "TRITONSERVER_DELAY_SCHEDULER": "2"}
    for test in _words("QUEUE_DELAY_TESTS", _QUEUE_DELAY):
        _run(qa, here, "queue_delay_models", f"SequenceBatcherTest.{test}", {**env, **delay})
    if "python" in backends:
        _preserve_ordering(qa, here, {**base, "NO_BATCHING": "0", "MODEL_INSTANCES": "1",
                                      "BATCHER_TYPE": "FIXED"})  # fmt: skip


def _preserve_ordering(qa: QA, here: Path, env: dict[str, str]) -> None:
    """SequenceBatcherPreserveOrderingTest over python_models/sequence_py, preserve_ordering
    on and off, decoupled and not."""
    models = qa.fresh(here / "preserve_ordering_models")
    base = qa.qa / "python_models" / "sequence_py"
    for mode in ("decoupled", "nondecoupled"):
        plain = models / f"seqpy_no_preserve_ordering_{mode}"
        (plain / "1").mkdir(parents=True)
        shutil.copy(base / "config.pbtxt", plain)
        shutil.copy(base / "model.py", plain / "1")
        preserve = qa.copy(plain, models / f"seqpy_preserve_ordering_{mode}")
        QA.sed(preserve / "config.pbtxt", r"^preserve_ordering: False", "preserve_ordering: True")
        for config in (plain / "config.pbtxt", preserve / "config.pbtxt"):
            _cpu_only(config)
            if mode == "decoupled":
                with config.open("a") as f:
                    f.write("\nmodel_transaction_policy { decoupled: true }\n")
    _run(qa, here, "preserve_ordering_models", "SequenceBatcherPreserveOrderingTest", env)


@suite
def l0_sequence_corrid_batcher(qa: QA) -> None:
    here = qa.suite("L0_sequence_corrid_batcher")
    models = qa.fresh(here / "models4")
    # (test.sh copies plan and libtorch models too: TensorRT and LibTorch are not built
    # here, and the test's "plan" trial fails on their absence)
    source = qa.generated("qa_dyna_sequence_model_repository") / "onnx_dyna_sequence_int32"
    model = qa.copy(source, models / source.name)
    config = model / "config.pbtxt"
    config.write_text(
        re.sub(r"oldest.*\{.*\}.*control_input", "control_input", config.read_text(),
               count=1, flags=re.S)
    )  # fmt: skip
    _edit(config, 1, 4)
    env = {"NO_BATCHING": "0", "MODEL_INSTANCES": "4", "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "0",
           "TRITONSERVER_DELAY_SCHEDULER": "12"}  # fmt: skip
    _corrid(qa, here, "models4", "SequenceCorrIDBatcherTest.test_skip_batch", env)
    add_sub = qa.fresh(here / "corrid_data_type") / "add_sub"
    (add_sub / "1").mkdir(parents=True)
    shutil.copy(qa.qa / "python_models" / "add_sub" / "model.py", add_sub / "1")
    for data_type in ("TYPE_STRING", "TYPE_UINT32", "TYPE_INT32", "TYPE_UINT64", "TYPE_INT64"):
        shutil.copy(qa.qa / "python_models" / "add_sub" / "config.pbtxt", add_sub)
        with (add_sub / "config.pbtxt").open("a") as f:
            f.write(
                'sequence_batching {     control_input [{         name: "CORRID"         '
                "control [{             kind: CONTROL_SEQUENCE_CORRID             "
                f"data_type: {data_type}             }}]\n        }}]         }}\n"
            )
        env = {
            "NO_BATCHING": "0",
            "MODEL_INSTANCES": "4",
            "TRITONSERVER_CORRID_DATA_TYPE": data_type,
        }
        _corrid(
            qa, here, "corrid_data_type", "SequenceCorrIDBatcherTest.test_corrid_data_type", env
        )


def _corrid(qa: QA, here: Path, models: str, test: str, env: dict[str, str]) -> None:
    note = env.get("TRITONSERVER_CORRID_DATA_TYPE", models)
    qa.served_test(
        "L0_sequence_corrid_batcher", here, [f"--model-repository={here / models}"],
        "sequence_corrid_batcher_test.py", test, log=f"{test}.{note}", what=f"{test} {note}",
        note=note, serve_env=env, test_env=env,
    )  # fmt: skip


_DYNA_FIRST = ("test_simple_sequence", "test_length1_sequence")
_DYNA_THEN = [
    "test_multi_sequence_different_shape",
    "test_multi_sequence",
    "test_multi_parallel_sequence",
    "test_backlog",
    "test_backlog_fill",
    "test_backlog_fill_no_end",
    "test_backlog_sequence_timeout",
]


@suite
def l0_dyna_implicit_state(qa: QA) -> None:
    """L0_dyna_sequence_batcher's test.sh with IMPLICIT_STATE=1 (the Oldest strategy,
    implicit state), as L0_dyna_implicit_state runs it; BACKENDS="onnx" (its default
    "onnx plan" less TensorRT)."""
    here = qa.suite("L0_dyna_sequence_batcher")
    models = qa.fresh(here / "models")
    for model in sorted(qa.generated("qa_dyna_sequence_implicit_model_repository").iterdir()):
        config = qa.copy(model, models / model.name) / "config.pbtxt"
        _cpu_only(config)
        QA.sed(config, "kind: KIND_CPU", "kind: KIND_CPU\ncount: 1")
    env = {"ENSEMBLES": "0", "BACKENDS": os.environ.get("BACKENDS", "onnx"), "IMPLICIT_STATE": "1"}
    for test in _DYNA_FIRST:
        _dyna(qa, here, test, {**env, "NO_BATCHING": "1"})
    for config in models.glob("*/config.pbtxt"):
        QA.sed(config, "max_candidate_sequences:.*", "max_candidate_sequences:4")
        QA.sed(config, "max_queue_delay_microseconds:.*", "max_queue_delay_microseconds:5000000")
    for test in _DYNA_THEN:
        _dyna(qa, here, test, {**env, "NO_BATCHING": "0"})


def _dyna(qa: QA, here: Path, test: str, env: dict[str, str]) -> None:
    qa.served_test(
        "L0_dyna_implicit_state", here, [f"--model-repository={here / 'models'}"],
        "dyna_sequence_batcher_test.py", f"DynaSequenceBatcherTest.{test}", log=test,
        what=test, note="", serve_env=env, test_env=env,
    )  # fmt: skip
