"""L0_model_config, as its Triton ``test.sh`` runs it: one fresh server per case folder;
a case that must fail to load passes when the server does not come up and its log has an
error line matching one of the case's ``expected*`` patterns (grep's, as test.sh's);
one that must load passes when ``compare_status.py`` finds the config the server
completed among its ``expected*`` configs, over HTTP and gRPC.

test.sh greps for glog's error lines (``^E[0-9]{4}...``); shoal's log lines read
``HH:MM:SS.mmm <role>[<pid>] E <logger>: <message>``, so the pattern is matched against
the messages of shoal's error lines (W for the warnings of cli_messages).

Cases run: cli_messages, special_cases, noautofill_platform (``TRIALS``, test.sh's list
of platforms, read from the environment; default ``onnxruntime_onnx``: shoal has no
TensorRT, and its LibTorch backend is an optional extra), and the ``common``, ``onnx``,
``python`` and ``ensemble`` folders of autofill_noplatform and autofill_noplatform_success
(BACKENDS, default ``"common onnx python ensemble"``). On a host without a GPU the
expected configs' ``gpus: 0 kind: KIND_GPU`` instance groups (Triton's CI has one) are
read as ``kind: KIND_CPU``, what Triton completes there. Left out: the TensorRT, OpenVINO and
PyTorch folders (their model files come from generators shoal does not run here),
``custom`` (Triton's C++ backends), model_metrics and custom_parameters.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from triton_qa import PYTHON, QA, suite

SUITE = "L0_model_config"


def _has_gpu() -> bool:
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


_LINE = re.compile(r"^\S+ \S+\[\d+\] ([A-Z]) \S+: (.*)$")


def _messages(log: Path, level: str) -> str:
    """The messages of the log's lines at ``level`` (E, W, I), one a line."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if match and match.group(1) == level:
            out.append(match.group(2))
    return "\n".join(out) + "\n"


def _grep(pattern: str, text: str) -> bool:
    """grep's basic regular expression, as test.sh's ``grep "$EX"``."""
    run = subprocess.run(["grep", "-q", "-e", pattern], input=text, text=True, check=False)
    return run.returncode == 0


def _expect_failure(
    qa: QA, here: Path, case: str, expecteds: list[Path], level: str, *args: str
) -> None:
    log = f"fail.{case.replace('/', '.')}"
    with qa.serve(here, f"--model-repository={here / 'models'}", *args, log=log) as ready:
        pass
    text = _messages(here / f"{log}.shoal.log", level)
    found = [e for e in expecteds if _grep(e.read_text().strip("\n"), text)]
    passed = not ready and bool(found)
    why = "" if passed else " (the server came up)" if ready else " (no expected message)"
    qa.count(SUITE, int(passed), 1, f"{case}{why}")


def _expect_success(qa: QA, here: Path, case: str, model: str, *args: str) -> None:
    log = f"ok.{case.replace('/', '.')}"
    with qa.serve(here, f"--model-repository={here / 'models'}", *args, log=log) as ready:
        if not ready:
            qa.count(SUITE, 0, 1, f"{case} (server not ready)")
            return
        run = subprocess.run(
            [str(PYTHON), "compare_status.py", "--expected_dir", f"models/{model}",
             "--model", model],
            cwd=here, env=qa.env, capture_output=True, text=True, check=False,
        )  # fmt: skip
    with (here / "client.log").open("a") as f:
        f.write(f"=== {case}\n{run.stdout}{run.stderr}")
    qa.count(
        SUITE,
        int(run.returncode == 0),
        1,
        f"{case}" + ("" if run.returncode == 0 else " (config differs)"),
    )


def _prepare(qa: QA, here: Path) -> None:
    """test.sh's version folders and model files, for the folders run here."""
    auto = qa.qa / "python_models" / "auto_complete" / "model.py"
    for case in (here / "autofill_noplatform" / "python").iterdir():
        _python_case(case, auto)
    for case in (here / "autofill_noplatform_success" / "python").iterdir():
        _python_case(case, auto)
    for parent in ("autofill_noplatform", "autofill_noplatform_success"):
        for case in (here / parent / "ensemble").iterdir():
            if (case / "config.pbtxt").exists():
                continue  # one model, whose config is what fails
            for model in case.iterdir():
                if (model / "config.pbtxt").exists():
                    (model / "1").mkdir(exist_ok=True)
                    _as_python(model)
    cpu = here / "autofill_noplatform_success" / "onnx" / "cpu_instance" / "1"
    cpu.mkdir(parents=True, exist_ok=True)
    identity = qa.generated("qa_identity_model_repository") / "onnx_zero_1_float16" / "1"
    shutil.copy(identity / "model.onnx", cpu)
    for case in ("invalid_cpu", "invalid_gpu", "negative_gpu"):
        (here / "noautofill_platform" / case / "1").mkdir(exist_ok=True)
    invalid = here / "special_cases" / "invalid_platform" / "1"
    invalid.mkdir(exist_ok=True)
    onnx = qa.generated("qa_model_repository") / "onnx_float32_float32_float32" / "1"
    shutil.copy(onnx / "model.onnx", invalid)
    escape = here / "special_cases" / "runtime_escape"
    (escape / "1").mkdir(exist_ok=True)
    (escape / "dummy_runtime").mkdir(exist_ok=True)
    (escape / "dummy_runtime" / "libtriton_identity.so").touch()
    (here / "special_cases" / "invalid_runtime" / "1").mkdir(exist_ok=True)
    if not _has_gpu():  # what Triton completes on a host without one
        for expected in (here / "autofill_noplatform_success").glob("*/*/**/expected*"):
            QA.sed(expected, r"^(\s*)gpus: 0\n\s*kind: KIND_GPU", r"\1kind: KIND_CPU")


# A Python stand-in for Triton's C++ ``repeat`` backend (never run here): each input, by
# position in the config, is the output of that position. (``identity`` is built in.)
IDENTITY = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        names = [[t["name"] for t in config.get(k, [])] for k in ("input", "output")]
        self.pairs = list(zip(*names))

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor(o, pb_utils.get_input_tensor_by_name(r, i).as_numpy())
                for i, o in self.pairs
            ])
            for r in requests
        ]
"""


def _as_python(model: Path) -> None:
    """An ensemble step served by Triton's C++ ``repeat`` backend becomes a Python model
    of the same config (its inputs, outputs and policy), so that the ensemble, not its
    missing backend, is what the case judges."""
    config = model / "config.pbtxt"
    text = config.read_text()
    if not re.search(r'^backend:\s*"repeat"', text, flags=re.M):
        return
    config.write_text(re.sub(r"^backend:.*$", 'backend: "python"', text, flags=re.M))
    for version in model.iterdir():
        if version.is_dir() and version.name.isdigit():
            (version / "model.py").write_text(IDENTITY)


def _python_case(case: Path, auto: Path) -> None:
    """A Python case's version folder: its own model.py, else python_models/auto_complete's
    (as test.sh's two lists have it)."""
    if not case.is_dir():
        return
    for sub in [case, *[d for d in case.iterdir() if d.is_dir()]]:
        own = sub / "model.py"
        if own.exists():
            (sub / "1").mkdir(exist_ok=True)
            shutil.copy(own, sub / "1")
        elif (sub / "config.pbtxt").exists() and sub == case:
            (sub / "1").mkdir(exist_ok=True)
            shutil.copy(auto, sub / "1")


def _fresh_models(here: Path, source: Path, whole: bool) -> None:
    models = QA.fresh(here / "models")
    if whole:
        QA.copy(source, models / source.name)
    else:
        for item in source.iterdir():
            if item.is_dir():
                QA.copy(item, models / item.name)
            else:
                shutil.copy(item, models)


@suite
def l0_model_config(qa: QA) -> None:
    here = qa.suite(SUITE)
    _prepare(qa, here)
    cli = {"cli_override": ("--disable-auto-complete-config", "--strict-model-config=false"),
           "cli_deprecation": ("--strict-model-config=true",)}  # fmt: skip
    for target, args in cli.items():
        _fresh_models(here, here / "cli_messages" / target, whole=True)
        expecteds = sorted((here / "models" / target).glob("expected*"))
        _expect_failure(qa, here, f"cli_messages/{target}", expecteds, "W", *args)
    for case in sorted((here / "special_cases").iterdir()):
        args = ("--disable-auto-complete-config",) if case.name == "invalid_platform" else ()
        _fresh_models(here, case, whole=True)
        expecteds = sorted((here / "models" / case.name).glob("expected*"))
        _expect_failure(qa, here, f"special_cases/{case.name}", expecteds, "E", *args)
    for trial in os.environ.get("TRIALS", "onnxruntime_onnx").split():
        for flag in ("--strict-model-config=true", "--disable-auto-complete-config"):
            for case in sorted((here / "noautofill_platform").iterdir()):
                _fresh_models(here, case, whole=True)
                config = here / "models" / case.name / "config.pbtxt"
                if config.exists():
                    text = re.sub(r"^.*platform:.*\n?", "", config.read_text(), flags=re.M)
                    config.write_text(f'{text.rstrip(chr(10))}\nplatform: "{trial}"\n')
                expecteds = sorted((here / "models" / case.name).glob("expected*"))
                what = f"noautofill_platform/{case.name} {trial} {flag}"
                _expect_failure(qa, here, what, expecteds, "E", flag)
    backends = os.environ.get("BACKENDS", "common onnx python ensemble").split()
    for folder in backends:
        top = here / "autofill_noplatform" / folder
        for case in sorted(top.iterdir()) if top.is_dir() else []:
            single = (case / "config.pbtxt").exists()
            _fresh_models(here, case, whole=single)
            place = here / "models" / case.name if single else here / "models"
            expecteds = sorted(place.glob("expected*"))
            what = f"autofill_noplatform/{folder}/{case.name}"
            _expect_failure(qa, here, what, expecteds, "E", "--strict-model-config=false")
    shaped = ("no_config", "no_config_variable", "no_config_shape_tensor",
              "no_config_non_linear_format_io")  # fmt: skip
    for folder in backends:
        top = here / "autofill_noplatform_success" / folder
        for case in sorted(top.iterdir()) if top.is_dir() else []:
            whole = (case / "config.pbtxt").exists() or case.name in shaped
            _fresh_models(here, case, whole=whole)
            what = f"autofill_noplatform_success/{folder}/{case.name}"
            _expect_success(qa, here, what, case.name, "--strict-model-config=false")
