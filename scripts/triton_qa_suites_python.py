"""L0_backend_python, the parts of its sub-suites shoal's Python backend serves, each as
its ``<sub>/test.sh`` runs it (L0_backend_python/test.sh runs them one after another).

Sub-suites (``SUBTESTS``, test.sh's name, read from the environment; default all of
these): ``model_control`` (explicit load and unload of a Python model and its ensemble,
model-name validation), ``lifecycle`` (errors, cancellation, models that fail in
initialize, finalize and auto_complete_config), ``argument_validation`` (pb_utils'
argument checks), ``parameters`` (response parameters, decoupled and BLS) and
``async_execute`` (async def execute, concurrency). Left out: what needs a GPU (KIND_GPU
models, GPU tensors through DLPack) or a clone of the python_backend repository
(``decoupled``'s example models), and the shared-memory page counts of Triton's stub
processes (shoal's Python models run in its workers); docs/triton-qa.md.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from triton_qa import QA, suite

SUITE = "L0_backend_python"


def _model(qa: QA, models: Path, source: str, name: str | None = None) -> Path:
    """``mkdir -p models/<name>/1; cp python_models/<source>/model.py ...; cp config``."""
    src = qa.qa / "python_models" / source
    dest = models / (name or source)
    (dest / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "model.py", dest / "1")
    if (src / "config.pbtxt").exists():
        shutil.copy(src / "config.pbtxt", dest)
    return dest


def _model_control(qa: QA, root: Path) -> None:
    here = root / "model_control"
    models = qa.fresh(here / "models")
    _model(qa, models, "identity_fp32")
    (models / "simple_identity_fp32" / "1").mkdir(parents=True)
    shutil.copy(
        qa.qa / "python_models" / "simple_identity_fp32" / "config.pbtxt",
        models / "simple_identity_fp32",
    )
    args = (f"--model-repository={models}", "--model-control-mode=explicit", "--log-verbose=1")
    with qa.serve(here, *args, log="model_control") as ready:
        for names in ((), ("ModelIDValidationTest",)):
            if ready:
                qa.test(SUITE, here, "model_control_test.py", *names, note="")
            else:
                qa.not_ready(SUITE, 1, " ".join(("model_control", *names)))


def _lifecycle(qa: QA, root: Path) -> None:
    here = root / "lifecycle"
    models = qa.fresh(here / "models")
    for name in ("error_code", "execute_cancel", "decoupled_grpc_error", "execute_return_error"):
        _model(qa, models, name)
    batching = {
        "execute_error": 12000000,
        "execute_grpc_error": 1200000,
    }
    for name, delay in batching.items():
        config = _model(qa, models, name) / "config.pbtxt"
        QA.sed(config, r"^name:.*", f'name: "{name}"')
        QA.sed(config, r"^max_batch_size:.*", "max_batch_size: 8")
        with config.open("a") as f:
            f.write(
                "dynamic_batching { preferred_batch_size: [8], "
                f"max_queue_delay_microseconds: {delay} }}\n"
            )
    config = _model(qa, models, "wrong_model") / "config.pbtxt"
    QA.sed(config, r"^name:.*", 'name: "wrong_model"')
    QA.sed(config, "TYPE_FP32", "TYPE_UINT32")
    args = (f"--model-repository={models}", "--log-verbose=1")
    with qa.serve(here, *args, log="lifecycle_server.log") as ready:  # (a test reads it)
        for i in range(5):  # (test.sh runs it five times against one server)
            if ready:
                qa.pytest(SUITE, here, "lifecycle_test.py", note=f"lifecycle run {i}")
            else:
                qa.not_ready(SUITE, 1, f"lifecycle_test.py run {i}")
    # models whose Python code fails: the server does not start, and says why
    for source, words, extra in (
        ("init_error", "name 'lorem_ipsum' is not defined", ()),
        ("fini_error", "name 'undefined_variable' is not defined", ()),
        ("auto_complete_error", "name 'undefined_variable' is not defined",
         ("--strict-model-config=false",)),
    ):  # fmt: skip
        models = qa.fresh(here / "models")
        model = _model(qa, models, source)
        if source == "auto_complete_error":
            (model / "config.pbtxt").unlink(missing_ok=True)
        log = f"lifecycle.{source}"
        with qa.server(here, f"--model-repository={models}", "--log-verbose=1", *extra,
                       log=log) as server:  # fmt: skip
            started = server.up
        found = words in server.log.read_text(errors="replace")
        # fini_error loads (its finalize fails at the stop); the others must not start
        passed = found and (started if source == "fini_error" else not started)
        qa.count(SUITE, int(passed), 1, f"test.sh: {source} ({'' if found else 'no '}{words!r})")


def _argument_validation(qa: QA, root: Path) -> None:
    here = root / "argument_validation"
    args = (f"--model-repository={here / 'models'}", "--log-verbose=1")
    with qa.serve(here, *args, log="argument_validation") as ready:
        if ready:
            qa.pytest(SUITE, here, "../test_infer_shm_leak.py", MODEL_NAME="argument_validation")
        else:
            qa.not_ready(SUITE, 1, "argument_validation")


def _served_pytest(qa: QA, here: Path, sources: list[str], file: str, log: str) -> None:
    models = qa.fresh(here / "models")
    for source in sources:
        _model(qa, models, source)
    args = (f"--model-repository={models}", "--log-verbose=1")
    with qa.server(here, *args, log=log) as server:
        if server.up:
            qa.pytest(SUITE, here, file, SERVER_LOG=str(server.log))
        else:
            qa.not_ready(SUITE, 1, file)


def _parameters(qa: QA, root: Path) -> None:
    sources = ["response_parameters", "response_parameters_decoupled", "response_parameters_bls"]
    _served_pytest(qa, root / "parameters", sources, "response_parameters_test.py", "parameters")


def _async_execute(qa: QA, root: Path) -> None:
    sources = ["async_execute_decouple", "async_execute_decouple_bls"]
    _served_pytest(qa, root / "async_execute", sources, "concurrency_test.py", "async_execute")


_SUBTESTS = {
    "model_control": _model_control,
    "lifecycle": _lifecycle,
    "argument_validation": _argument_validation,
    "parameters": _parameters,
    "async_execute": _async_execute,
}


@suite
def l0_backend_python(qa: QA) -> None:
    root = qa.suite("L0_backend_python")
    for name in os.environ.get("SUBTESTS", " ".join(_SUBTESTS)).split():
        _SUBTESTS[name](qa, root)
