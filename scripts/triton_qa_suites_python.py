"""L0_backend_python, the parts of its sub-suites shoal's Python backend serves, each as
its ``<sub>/test.sh`` runs it (L0_backend_python/test.sh runs them one after another).

Sub-suites (``SUBTESTS``, test.sh's name, read from the environment; default all of
these): ``model_control`` (explicit load and unload of a Python model and its ensemble,
model-name validation), ``lifecycle`` (errors, cancellation, models that fail in
initialize, finalize and auto_complete_config), ``argument_validation`` (pb_utils'
argument checks), ``parameters`` (response parameters, decoupled and BLS),
``async_execute`` (async def execute, concurrency), ``model_readiness`` (a model's own
``is_ready``), ``request_rescheduling`` (iterative sequences) and ``logging``
(pb_utils.Logger's lines at each level and log setting). Left out: what needs a
GPU (KIND_GPU models, GPU tensors through DLPack) or a clone of the python_backend repository
(``decoupled``'s example models), and the shared-memory page counts of Triton's stub
processes (shoal's Python models run in its workers); docs/triton-qa.md.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
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


def _model_readiness(qa: QA, root: Path) -> None:
    """User-defined ``is_ready()``: test.sh's models (readiness_model.py with its
    parameters, the coroutine one, the decoupled one) and TestUserDefinedModelReadinessFunction.
    Its first part kills Triton's stub process and greps for the stub's words; shoal has
    no stub (the model runs in its worker, which is restarted), so it is left out."""
    here = root / "model_readiness"
    models = qa.fresh(here / "models")
    identity = _model(qa, models, "identity_fp32") / "config.pbtxt"
    setups = {
        "is_ready_fn_returns_true": ("true", "0.1"),
        "is_ready_fn_returns_false": ("false", "0.1"),
        "is_ready_fn_raises_error": ("exception", "0.1"),
        "is_ready_fn_returns_non_boolean": ("non_boolean", "0.1"),
        "is_ready_fn_timeout": ("true", "8"),
        "is_ready_fn_coroutine_returns_true": ("coroutine", "0.1"),
    }
    for name, (value, delay) in setups.items():
        (models / name / "1").mkdir(parents=True)
        source = "readiness_coroutine_model.py" if "coroutine" in name else "readiness_model.py"
        shutil.copy(here / "test_models" / source, models / name / "1" / "model.py")
        config = models / name / "config.pbtxt"
        shutil.copy(identity, config)
        QA.sed(config, r"^name:.*", f'name: "{name}"')
        with config.open("a") as f:
            for key, v in (
                ("READINESS_FN_RETURN_VALUE", value),
                ("READINESS_FN_DELAY_SECS", delay),
            ):
                f.write(f'parameters: {{\n  key: "{key}"\n  value: {{ string_value: "{v}" }}\n}}\n')
    shutil.copytree(
        here / "test_models" / "is_ready_fn_returns_true_decoupled",
        models / "is_ready_fn_returns_true_decoupled" / "1",
    )
    shutil.move(
        models / "is_ready_fn_returns_true_decoupled" / "1" / "config.pbtxt",
        models / "is_ready_fn_returns_true_decoupled" / "config.pbtxt",
    )
    args = (f"--model-repository={models}", "--log-verbose=1", "--strict-readiness=false")
    with qa.serve(here, *args, log="test_user_defined_model_readiness_function_server") as ready:
        if ready:
            qa.test(SUITE, here, "test_model_readiness.py",
                    "TestUserDefinedModelReadinessFunction", note="")  # fmt: skip
        else:
            qa.not_ready(SUITE, 7, "test_model_readiness.py")
    qa.not_run(SUITE, 2, "model_readiness signal 11 and 9 runs", "they kill Triton's stub process")


def _request_rescheduling(qa: QA, root: Path) -> None:
    here = root / "request_rescheduling"
    models = qa.fresh(here / "models")
    sources = ["bls_request_rescheduling", "request_rescheduling_addsub", "iterative_sequence",
               "wrong_return_type"]  # fmt: skip
    for source in sources:
        _model(qa, models, source)
    args = (f"--model-repository={models}", "--model-control-mode=explicit", "--load-model=*",
            "--log-verbose=1")  # fmt: skip
    with qa.serve(here, *args, log="request_rescheduling_server") as ready:
        for target, env in (
            ("../test_infer_shm_leak.py", {"MODEL_NAME": "bls_request_rescheduling"}),
            ("grpc_endpoint_test.py", {}),
        ):
            if ready:
                qa.pytest(SUITE, here, target, **env)
            else:
                qa.not_ready(SUITE, 1, target)


def _post_logging(setting: str, value: bool | int) -> int:
    """``curl -d'{"<setting>": <value>}' localhost:8000/v2/logging``: the status."""
    body = json.dumps({setting: value}).encode()
    request = urllib.request.Request("http://localhost:8000/v2/logging", data=body)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def _logging(qa: QA, root: Path) -> None:
    """pb_utils.Logger's lines in the server's log, counted as test.sh's verify_log_counts
    counts them, after a server with the default settings, one whose verbose logging is
    turned on (through /v2/logging, after the model's initialize logged), and one whose
    info, warning and error logging are turned off: each count is one check."""
    here = root / "logging"
    models = qa.fresh(here / "models")
    _model(qa, models, "identity_fp32_logging")
    off = {"log_info": False, "log_warning": False, "log_error": False}
    phases: list[tuple[str, dict[str, bool | int], int, int]] = [
        ("default", {}, 4, 0), ("verbose", {"log_verbose_level": 1}, 4, 3), ("disabled", off, 1, 0),
    ]  # fmt: skip
    for name, settings, plain, verbose in phases:
        with qa.serve(here, f"--model-repository={models}", log="logging_server.log") as ready:
            if not ready:
                qa.not_ready(SUITE, len(settings) + 6, f"logging_test.py ({name})")
                continue
            for key, value in settings.items():
                code = _post_logging(key, value)
                qa.count(SUITE, int(code == 200), 1, f"test.sh ({name}): POST /v2/logging {key}")
            qa.pytest(SUITE, here, "logging_test.py", note=f"({name})")
        lines = (here / "logging_server.log").read_text(errors="replace").splitlines()
        for word, want in (("Specific", plain), ("Info", plain), ("Warning", plain),
                           ("Error", plain), ("Verbose", verbose)):  # fmt: skip
            got = sum(f"{word} Msg!" in line for line in lines)
            what = f"test.sh ({name}): {got} '{word} Msg!' lines, {want} expected"
            qa.count(SUITE, int(got == want), 1, what)


_SUBTESTS = {
    "model_control": _model_control,
    "lifecycle": _lifecycle,
    "argument_validation": _argument_validation,
    "parameters": _parameters,
    "async_execute": _async_execute,
    "model_readiness": _model_readiness,
    "request_rescheduling": _request_rescheduling,
    "logging": _logging,
}


@suite
def l0_backend_python(qa: QA) -> None:
    root = qa.suite("L0_backend_python")
    for name in os.environ.get("SUBTESTS", " ".join(_SUBTESTS)).split():
        _SUBTESTS[name](qa, root)
