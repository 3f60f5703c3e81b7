"""L0_backend_python, the parts of its sub-suites shoal's Python backend serves, each as
its ``<sub>/test.sh`` runs it (L0_backend_python/test.sh runs them one after another).

Sub-suites so far: ``model_control`` (explicit load and unload of a Python model and its
ensemble, model-name validation).
"""

from __future__ import annotations

import shutil

from triton_qa import QA, suite


@suite
def l0_backend_python(qa: QA) -> None:
    here = qa.suite("L0_backend_python") / "model_control"
    models = qa.fresh(here / "models")
    python_models = qa.qa / "python_models"
    (models / "identity_fp32" / "1").mkdir(parents=True)
    (models / "simple_identity_fp32" / "1").mkdir(parents=True)
    shutil.copy(python_models / "identity_fp32" / "model.py", models / "identity_fp32" / "1")
    shutil.copy(python_models / "identity_fp32" / "config.pbtxt", models / "identity_fp32")
    shutil.copy(
        python_models / "simple_identity_fp32" / "config.pbtxt", models / "simple_identity_fp32"
    )
    args = (f"--model-repository={models}", "--model-control-mode=explicit", "--log-verbose=1")
    with qa.serve(here, *args, log="model_control") as ready:
        for names in ((), ("ModelIDValidationTest",)):
            if ready:
                qa.test("L0_backend_python", here, "model_control_test.py", *names, note="")
            else:
                qa.not_ready("L0_backend_python", 1, " ".join(("model_control", *names)))
