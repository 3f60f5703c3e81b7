"""L0_lifecycle's cases over Triton's ``identity`` backend (built into shoal): the
shutdown tests over ``custom_zero_1_float32`` and ``ensemble_zero_1_float32``, the same
model loaded and unloaded concurrently, and the Python model reloaded as an identity
one (a config override). Each as its test.sh section runs it, in order; the rest of the
suite is ``scripts/triton_qa_suites_lifecycle.py``."""

from __future__ import annotations

from pathlib import Path

from triton_qa import QA
from triton_qa_suites_lifecycle import (
    _case,
    _check,
    _explicit,
    _fresh,
    _grep_count,
    _python_model,
)

#: test.sh's grep after test_shutdown_dynamic and _ensemble: Triton's shutdown countdown,
#: which shoal does not log (it stops accepting at once; docs/triton-qa.md)
_COUNTDOWN = "Found 1 gRPC service connections and inference handlers"


def _delayed_custom(qa: QA, models: Path) -> None:
    """``custom_zero_1_float32`` with dynamic batching and a 5 s execute delay."""
    model = qa.copy(
        qa.qa / "custom_models" / "custom_zero_1_float32", models / "custom_zero_1_float32"
    )
    (model / "1").mkdir(exist_ok=True)
    with (model / "config.pbtxt").open("a") as f:
        f.write(
            "dynamic_batching {}\nparameters [\n"
            '{ key: "execute_delay_ms"; value: { string_value: "5000" }}\n]\n'
        )


def shutdowns(qa: QA, here: Path) -> None:
    """test_shutdown_dynamic and test_shutdown_ensemble, each with its log check."""
    (models,) = _fresh(here, "models")
    _delayed_custom(qa, models)
    args = (f"--model-repository={models}", "--log-verbose=1", "--exit-timeout-secs=120")
    log = _case_log(qa, here, "test_shutdown_dynamic", args)
    _check(qa, _grep_count(log, _COUNTDOWN) > 0, f"test_shutdown_dynamic log: {_COUNTDOWN!r}")
    qa.not_run(
        "L0_lifecycle", 2, "test_shutdown_sequence and its log check",
        "custom_sequence_int32 is Triton's C++ sequence backend",
    )  # fmt: skip
    (models,) = _fresh(here, "models")
    (qa.copy(here / "ensemble_zero_1_float32", models / "ensemble_zero_1_float32") / "1").mkdir(
        exist_ok=True
    )
    _delayed_custom(qa, models)
    args = (f"--model-repository={models}", "--log-verbose=1")
    log = _case_log(qa, here, "test_shutdown_ensemble", args)
    _check(qa, _grep_count(log, _COUNTDOWN) > 0, f"test_shutdown_ensemble log: {_COUNTDOWN!r}")


def _case_log(qa: QA, here: Path, name: str, args: tuple[str, ...]) -> Path:
    _case(qa, here, name, args)
    return here / f"{name}.shoal.log"


def load_unload_stress(qa: QA, here: Path) -> None:
    """test_concurrent_same_model_load_unload_stress, left out: 32 threads each load and
    unload identity_zero_1_int32 1024 times; each shoal load starts a worker process
    (about 4 a second on this 2-CPU machine: over two hours), and an unload that overtakes
    a load answers the load with shoal's own words, which the test does not accept
    (docs/model-repository.md)."""
    qa.not_run(
        "L0_lifecycle", 1, "test_concurrent_same_model_load_unload_stress",
        "32 x 1024 loads and unloads, each a worker process here (hours)",
    )  # fmt: skip


def reloaded_as_identity(qa: QA, here: Path) -> None:
    """test_model_config_overwite (a Python model with no config, reloaded with an
    identity config) and test_shutdown_while_background_unloading (its finalize takes
    10 s) with test.sh's count of "successfully unloaded" lines."""
    (models,) = _fresh(here, "models")
    model = _python_model(
        qa, "identity_fp32", models / "identity_fp32",
        append="    def initialize(self, args):\n        import time\n        time.sleep(5)\n",
    )  # fmt: skip
    (model / "config.pbtxt").unlink()
    load = ("--load-model=identity_fp32",)
    _case(qa, here, "test_model_config_overwite", (*_explicit(models), *load))
    (models,) = _fresh(here, "models")
    _python_model(
        qa, "identity_fp32", models / "identity_fp32",
        append="    def finalize(self):\n        import time\n        time.sleep(10)\n",
    )  # fmt: skip
    name = "test_shutdown_while_background_unloading"
    log = _case_log(qa, here, name, (*_explicit(models), *load, "--log-verbose=2"))
    unloaded = _grep_count(log, "successfully unloaded")
    _check(qa, unloaded == 2, f"{name}: 2 'successfully unloaded' lines (found {unloaded})")
