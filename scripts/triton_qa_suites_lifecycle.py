"""L0_lifecycle, as its Triton ``test.sh`` runs it: a fresh server per case, with the
case's repositories, flags and edits, then ``lifecycle_test.py LifeCycleTest.<case>``
and test.sh's own checks (log greps, servers that must not start, curl status codes),
each counted as one test.

A case runs when shoal serves every model its test names (ONNX, TorchScript from
``gen_qa_models.py --libtorch``, Python); models that only test.sh's ``for i in ...``
loops add and the test never names (OpenVINO and TensorRT copies beside the ONNX one)
are left out, and the invalid-endpoint checks, which look at URLs alone, serve an ONNX
model where test.sh's loop serves an OpenVINO one. Cases whose test names an OpenVINO or
TensorRT model, Triton's C++ ``identity`` backend or its custom ``custom_zero_1_float32``
/ ``custom_sequence_int32`` models, or a GPU, are counted as not run, with the reason
(docs/triton-qa.md).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from triton_qa import QA, suite

from shoal.dataplane.plane import SERVER_VERSION

SUITE = "L0_lifecycle"
TEST = "lifecycle_test.py"
F32 = "float32_float32_float32"
#: what the Triton container exports, and test_parse_error_noexit compares with the
#: server's metadata
ENV = {"TRITON_SERVER_VERSION": SERVER_VERSION}

_OPENVINO = "its test names an OpenVINO model (the runner does not generate them yet)"
_PLAN = "its test names a TensorRT (plan) model"


def _fresh(here: Path, *names: str) -> list[Path]:
    return [QA.fresh(here / n) for n in names]


def _case(
    qa: QA,
    here: Path,
    name: str,
    args: Sequence[str],
    *,
    log: str | None = None,
    test_env: dict[str, str] | None = None,
) -> None:
    """``run_server`` with ``args``, then ``python lifecycle_test.py LifeCycleTest.<name>``."""
    log = log or name
    with qa.server(here, *args, log=log) as server:
        if server.up:
            env = {**ENV, "SERVER_PID": str(server.proc.pid), "SERVER_LOG": str(server.log)}
            qa.test(SUITE, here, TEST, f"LifeCycleTest.{name}", note="", **env, **(test_env or {}))
        else:
            qa.not_ready(SUITE, 1, name)


def _check(qa: QA, passed: bool, what: str) -> None:
    """One of test.sh's own checks."""
    qa.count(SUITE, int(passed), 1, f"test.sh: {what}")


def _grep_count(log: Path, pattern: str) -> int:
    return len(re.findall(pattern, log.read_text(errors="replace")))


def _http_code(url: str, method: str = "GET") -> int:
    """curl -s -w %{http_code}: the status, 0 when nothing answered."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def _f32(qa: QA, kind: str, dest: Path, name: str | None = None) -> Path:
    """``cp -r $DATADIR/qa_model_repository/<kind>_float32_float32_float32 <dest>/``"""
    model = f"{kind}_{F32}"
    return qa.copy(qa.generated("qa_model_repository") / model, dest / (name or model))


def _ensemble(qa: QA, kind: str, dest: Path) -> Path:
    data = qa.generated("qa_ensemble_model_repository/qa_model_repository")
    return qa.copy(data / f"simple_{kind}_{F32}", dest / f"simple_{kind}_{F32}")


def _python_model(qa: QA, source: str, dest: Path, *, append: str = "") -> Path:
    """``cp -r ../python_models/<source> <dest>`` with model.py moved into ``1/``, and
    ``append`` added to it (test.sh's ``echo ... >> 1/model.py``)."""
    model = qa.copy(qa.qa / "python_models" / source, dest)
    (model / "1").mkdir(exist_ok=True)
    shutil.move(model / "model.py", model / "1" / "model.py")
    if append:
        with (model / "1" / "model.py").open("a") as f:
            f.write(append)
    return model


def _sleep_in_initialize(secs: int) -> str:
    return f"    def initialize(self, args):\n        import time\n        time.sleep({secs})\n"


# -- the cases, in test.sh's order --------------------------------------------------------


def _parse_error_noexit(qa: QA, here: Path) -> None:
    (models,) = _fresh(here, "models")
    for i, repos in enumerate(
        (
            ["/tmp/xyzx"],
            ["/tmp/xyzx"],
            ["/tmp/xyzx", str(models)],
            [str(models), "/tmp/xyzx"],
        )
    ):
        strict = "true" if i % 2 == 0 else "false"
        args = [*(f"--model-repository={r}" for r in repos), f"--strict-readiness={strict}"]
        args.append("--exit-on-error=false")
        with qa.server(here, *args, log=f"parse_error_noexit.{i}", wait="started") as server:
            if server.up:
                name = "LifeCycleTest.test_parse_error_noexit"
                qa.test(SUITE, here, TEST, name, note=" ".join(args[-3:]), **ENV)
            else:
                qa.not_ready(SUITE, 1, f"test_parse_error_noexit ({' '.join(args)})")


def _port_collisions(qa: QA, here: Path) -> None:
    """A second server on a port the first holds logs tritonserver's error for it."""
    (models,) = _fresh(here, "models")
    repo = f"--model-repository={models}"
    cases = (
        ("grpc", ("--http-port", "8003", "--metrics-port", "8004"), "GRPC", "0.0.0.0:8001", 1),
        ("http", ("--grpc-port", "8003", "--metrics-port", "8004"), "HTTP", "0.0.0.0:8000", 1),
        ("metrics", ("--grpc-port", "8003", "--http-port", "8004"), "Metrics", "0.0.0.0:8002", 1),
        ("multiple", (), ".*", ".*", 0),
    )
    for what, extra, service, socket, exactly in cases:
        with qa.server(here, repo, log=f"collision.{what}.stub") as first:
            if not first.up:
                _check(qa, False, f"{what} port collision (first server not ready)")
                continue
            with qa.server(here, repo, *extra, log=f"collision.{what}", wait="none") as second:
                _wait_exit(second.proc, 30)
                pattern = (
                    f"failed to start {service} service: Unavailable - "
                    f"Socket '{socket}' already in use"
                )
                n = _grep_count(second.log, pattern)
                passed = n == exactly if exactly else n > 0
                _check(qa, passed, f"{what} port collision logged ({n} lines)")
    with qa.server(here, repo, log="collision.none.stub") as first:
        extra = ("--grpc-port", "8003", "--http-port", "8004", "--metrics-port", "8005")
        with qa.server(here, repo, *extra, log="collision.none", wait="none") as second:
            _wait_exit(second.proc, 10)
            _check(qa, first.up and second.proc.poll() is None, "no port collision")


def _wait_exit(proc: subprocess.Popen[bytes], secs: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(secs)


def _ignored_versions(qa: QA, here: Path) -> None:
    for name, folder, message in (
        (
            "test_parse_ignore_zero_prefixed_version",
            "003",
            "ignore version directory '003' which contains leading zeros in its directory name",
        ),
        (
            "test_parse_ignore_non_intergral_version",
            "abc",
            "ignore version directory 'abc' which fails to convert to integral number",
        ),
    ):
        (models,) = _fresh(here, "models")
        model = _f32(qa, "libtorch", models)
        shutil.move(model / "3", model / folder)
        args = (f"--model-repository={models}", "--exit-on-error=false", "--exit-timeout-secs=5")
        _case(qa, here, name, args)
        log = here / f"{name}.shoal.log"
        _check(qa, _grep_count(log, re.escape(message)) > 0, f"{name} log: {message}")


def _dynamic_load_unload(qa: QA, here: Path) -> None:
    poll = ("--repository-poll-secs=1", "--model-control-mode=poll")
    for name, control in (
        ("test_dynamic_model_load_unload", poll),
        ("test_dynamic_model_load_unload_disabled", ("--model-control-mode=none",)),
    ):
        (models,) = _fresh(here, "models")
        shutil.rmtree(here / f"libtorch_{F32}", ignore_errors=True)
        _f32(qa, "onnx", models)  # (test.sh's loop: openvino onnx plan)
        _f32(qa, "libtorch", here)
        _case(qa, here, name, (f"--model-repository={models}", *control, "--exit-timeout-secs=5"))
    for name, control in (
        ("test_dynamic_version_load_unload", poll),
        ("test_dynamic_version_load_unload_disabled", ("--model-control-mode=none",)),
    ):
        (models,) = _fresh(here, "models")
        model = "libtorch_int32_int32_int32"
        qa.copy(qa.generated("qa_model_repository") / model, models / model)
        _case(qa, here, name, (f"--model-repository={models}", *control, "--exit-timeout-secs=5"))


def _model_control(qa: QA, here: Path) -> None:
    explicit = (
        "--model-control-mode=explicit",
        "--exit-timeout-secs=5",
        "--strict-model-config=false",
        "--strict-readiness=false",
    )
    for name in ("test_model_control", "test_model_control_fail", "test_model_control_ensemble"):
        (models,) = _fresh(here, "models")
        configs = [_f32(qa, "onnx", models) / "config.pbtxt"]
        if name == "test_model_control_fail":
            for version in (models / f"onnx_{F32}").iterdir():
                if version.is_dir():
                    for f in version.iterdir():
                        f.unlink()
        else:
            configs.append(_ensemble(qa, "onnx", models) / "config.pbtxt")
        for config in configs:
            QA.sed(config, r"max_batch_size:.*", "max_batch_size: 1")
        _case(qa, here, name, (f"--model-repository={models}", *explicit))


def _startup_refusals(qa: QA, here: Path) -> None:
    """Servers that must not start: ``--load-model=*`` beside another --load-model, and a
    --load-model that names no model (with the error in the log)."""
    models, models_0 = here / "models", here / "models_0"
    QA.fresh(models)
    models_0.mkdir(exist_ok=True)
    QA.sed(_f32(qa, "onnx", models) / "config.pbtxt", r"max_batch_size:.*", "max_batch_size: 1")
    args = (
        f"--model-repository={models}",
        f"--model-repository={models_0}",
        "--model-control-mode=explicit",
        "--strict-readiness=true",
        "--exit-on-error=true",
        "--load-model=*",
        f"--load-model=onnx_{F32}",
    )
    with qa.server(here, *args, log="load_model_star_and_other") as server:
        _check(qa, not server.up, "--load-model=* with another --load-model refused")
    (models,) = _fresh(here, "models")
    args = (
        f"--model-repository={models}",
        "--model-control-mode=explicit",
        "--strict-readiness=true",
        "--exit-on-error=true",
        "--load-model=does-not-exist",
    )
    with qa.server(here, *args, log="load_model_not_found") as server:
        pass
    found = _grep_count(server.log, "model not found in any model repository") > 0
    _check(qa, not server.up and found, "--load-model of no model: no start, error logged")


def _invalid_endpoints(qa: QA, here: Path) -> None:
    (models,) = _fresh(here, "models")
    # test.sh's loop serves openvino_int32_int32_int32; the checks are of the URLs alone
    model = "onnx_int32_int32_int32"
    qa.copy(qa.generated("qa_model_repository") / model, models / model)
    args = (f"--model-repository={models}", "--model-control-mode=none", "--exit-timeout-secs=5")
    with qa.server(here, *args, log="invalid_endpoints") as server:
        for path in ("/notapi/v2", "/v2/notapi", "/v2/models/notapi/foo"):
            code = _http_code(f"http://localhost:8000{path}") if server.up else 0
            _check(qa, code == 404, f"GET {path} answers 404 (got {code})")


def _overrides(qa: QA, here: Path) -> None:
    (models,) = _fresh(here, "models")
    model = _f32(qa, "onnx", models)
    for version in ("1", "3"):
        for f in (model / version).iterdir():
            f.unlink()
    args = (
        f"--model-repository={models}",
        f"--model-repository={models}",
        "--model-control-mode=explicit",
        "--strict-model-config=false",
    )
    _case(qa, here, "test_config_override", args)
    (models,) = _fresh(here, "models")
    model = _f32(qa, "onnx", models)
    shutil.rmtree(model / "1")
    args = (
        f"--model-repository={models}",
        "--model-control-mode=explicit",
        f"--load-model=onnx_{F32}",
        "--strict-model-config=false",
    )
    with qa.server(here, *args, log="test_file_override") as server:
        for name in ("test_file_override", "test_file_override_security"):
            if server.up:
                qa.test(SUITE, here, TEST, f"LifeCycleTest.{name}", note="", **ENV)
            else:
                qa.not_ready(SUITE, 1, name)


def _gpu_limit_flags(qa: QA, here: Path) -> None:
    (models,) = _fresh(here, "models")
    for limit, message in (
        ("-1:0.6", "expects device ID >= 0, got -1"),
        ("0:-0.4", r"expects limit fraction to be in range \[0.0, 1.0\], got -0.4"),
    ):
        args = (
            f"--model-repository={models}",
            "--model-control-mode=explicit",
            "--model-load-gpu-limit",
            limit,
        )
        with qa.server(here, *args, log=f"gpu_limit.{limit}") as server:
            pass
        found = _grep_count(server.log, message) > 0
        _check(qa, not server.up and found, f"--model-load-gpu-limit {limit} refused")


def _concurrent_instances(qa: QA, here: Path) -> None:
    (models,) = _fresh(here, "models")
    model = _python_model(
        qa, "identity_fp32", models / "identity_fp32", append=_sleep_in_initialize(10)
    )
    (model / "config.pbtxt").unlink()
    _case(
        qa,
        here,
        "test_concurrent_model_instance_load_speedup",
        (f"--model-repository={models}", "--model-control-mode=explicit"),
    )
    (models,) = _fresh(here, "models")
    python = _python_model(qa, "identity_fp32", models / f"python_{F32}")
    (python / "config.pbtxt").unlink()
    (models / f"onnx_{F32}").mkdir()
    qa.copy(qa.generated("qa_model_repository") / f"onnx_{F32}" / "1", models / f"onnx_{F32}" / "1")
    _case(
        qa,
        here,
        "test_concurrent_model_instance_load_sanity",
        (f"--model-repository={models}", "--model-control-mode=explicit", "--log-verbose=2"),
        test_env={"PARALLEL_BACKENDS": "python onnx"},
    )


def _load_retry(qa: QA, here: Path) -> None:
    for retry in ((), ("--model-load-retry-count=1",)):
        (models,) = _fresh(here, "models")
        qa.copy(here / "retry_model", models / "retry_model")
        args = (f"--model-repository={models}", "--model-control-mode=none", *retry)
        with qa.server(here, *args, log=f"load_retry.{len(retry)}") as server:
            if not retry:
                _check(qa, not server.up, "a model failing its first load: no start")
            else:
                code = _http_code("http://localhost:8000/v2/models/retry_model/ready")
                _check(qa, server.up and code == 200, f"--model-load-retry-count=1 (ready {code})")


def _python_lifecycle(qa: QA, here: Path, more: ModuleType) -> None:
    """The identity_fp32 cases (``more``: the identity backend's module of cases)."""
    more.reloaded_as_identity(qa, here)
    args = (f"--model-repository={here / 'models'}", "--model-control-mode=explicit")
    (models,) = _fresh(here, "models")
    _python_model(qa, "identity_fp32", models / "identity_fp32", append=_sleep_in_initialize(10))
    _case(qa, here, "test_shutdown_while_loading", (*args, "--log-verbose=2"))
    (models,) = _fresh(here, "models")
    _python_model(qa, "add_sub", models / "add_sub")
    _case(qa, here, "test_shutdown_with_live_connection", (f"--model-repository={models}",))


def _custom_configs(qa: QA, here: Path) -> None:
    for name in ("test_add_custom_config", "test_delete_custom_config"):
        (models,) = _fresh(here, "models")
        for stale in here.glob("config.pbtxt.*"):
            stale.unlink()
        model = _f32(qa, "libtorch", models)
        (model / "configs").mkdir()
        custom = re.sub(
            r"^version_policy:.*",
            "version_policy: { specific: { versions: [2] }}",
            (model / "config.pbtxt").read_text(),
            flags=re.M,
        )
        target = "config.pbtxt.custom.libtorch" if name == "test_add_custom_config" else None
        (here / target if target else model / "configs" / "custom.pbtxt").write_text(custom)
        args = (
            f"--model-repository={models}",
            "--repository-poll-secs=1",
            "--model-control-mode=poll",
            "--exit-timeout-secs=5",
            "--model-config-name=custom",
        )
        _case(qa, here, name, args)


def _new_model_version(qa: QA, here: Path) -> None:
    (models,) = _fresh(here, "models")
    model = qa.copy(qa.qa / "python_models" / "identity_fp32", models / "identity_fp32")
    with (model / "config.pbtxt").open("a") as f:
        f.write("version_policy: { specific: { versions: [1, 2] } }\n")
    with (model / "model.py").open("a") as f:
        f.write(
            "    def initialize(self, args):\n"
            "        pb_utils.Logger.log_info(f'[PB model] Loading version "
            '{args["model_version"]}\')\n'
        )
    for version in ("1", "2", "3"):
        (model / version).mkdir()
        shutil.copy(model / "model.py", model / version)
    (model / "model.py").unlink()
    args = (f"--model-repository={models}", "--model-control-mode=explicit", "--load-model=*")
    dont_write = {"PYTHONDONTWRITEBYTECODE": "True"}
    with qa.server(here, *args, log="test_load_new_model_version", env=dont_write) as server:
        if server.up:
            env = {**ENV, "SERVER_LOG": str(server.log)}
            qa.test(SUITE, here, TEST, "LifeCycleTest.test_load_new_model_version", note="", **env)
        else:
            qa.not_ready(SUITE, 1, "test_load_new_model_version")


def _loaded_case(
    qa: QA, here: Path, name: str, args: Sequence[str], model: str, *, log: str,
    test_env: dict[str, str] | None = None,
) -> Path:  # fmt: skip
    """``_case`` with the server's pid and log in the test's environment (the test reads
    them); the server is ready once its start-up load of ``model`` is over, as
    tritonserver is, ``--strict-readiness=false`` or not. Returns the server's log."""
    with qa.server(here, *args, log=log) as server:
        if server.up:
            env = {**ENV, "SERVER_PID": str(server.proc.pid), "SERVER_LOG": str(server.log)}
            qa.test(SUITE, here, TEST, f"LifeCycleTest.{name}", note="", **env, **(test_env or {}))
        else:
            qa.not_ready(SUITE, 1, name)
    return server.log


def _identity_reloads(qa: QA, here: Path) -> None:
    """test_model_availability_on_reload(_2, _3) over both protocols and
    test_model_reload_fail: ``identity_zero_1_int32``, Triton's identity backend (built
    into shoal) with a 10 s creation delay, reloaded while it serves."""
    args = ("--model-control-mode=explicit", "--exit-timeout-secs=5",
            "--strict-model-config=false", "--load-model=identity_zero_1_int32",
            "--strict-readiness=false")  # fmt: skip
    source = here / "identity_zero_1_int32"
    only_1 = "version_policy: { specific { versions: [1] }}\n"
    only_2 = "version_policy: { specific { versions: [2] }}\n"
    base = (source / "config.pbtxt").read_text()
    # name: (the versions, the served config, test.sh's copies of a config beside it)
    cases = {
        "test_model_availability_on_reload": ((1,), base, {}),
        "test_model_availability_on_reload_2": ((1, 2), base + only_1,
                                                {"config.pbtxt.v2": base + only_2}),
        "test_model_availability_on_reload_3": ((1, 2), base + only_1,
                                                {"config.pbtxt.new": base + only_1}),
    }  # fmt: skip
    gpu = (base + only_2).replace("KIND_CPU", "KIND_GPU")
    reload_fail = ((1, 2), base + only_1, {"config.pbtxt.v2.gpu": gpu})
    runs = [(n, p) for n in cases for p in ("grpc", "http")] + [("test_model_reload_fail", "")]
    for name, protocol in runs:
        versions, config, copies = cases.get(name, reload_fail)
        (models,) = _fresh(here, "models")
        for old in here.glob("config.pbtxt.*"):
            old.unlink()
        model = qa.copy(source, models / "identity_zero_1_int32")
        (model / "config.pbtxt").write_text(config)
        for v in versions:
            (model / str(v)).mkdir(parents=True, exist_ok=True)
        for copy, text in copies.items():
            (here / copy).write_text(text)
        env = {"TRITONSERVER_USE_GRPC": "1"} if protocol == "grpc" else {}
        repo = f"--model-repository={models}"
        what = f"{name}_{protocol}" if protocol else name
        log = _loaded_case(qa, here, name, (repo, *args), "identity_zero_1_int32", log=what,
                           test_env=env)  # fmt: skip
    words = (
        "failed to load 'identity_zero_1_int32' version 2: Internal: GPU instances not supported"
    )
    _check(qa, _grep_count(log, re.escape(words)) > 0, f"test_model_reload_fail log: {words!r}")


def _renamed(model: Path, old: str, new: str) -> Path:
    """``mv``/``cp`` of a model folder to ``new``, with ``sed -i s/old/new/`` on its config."""
    QA.sed(model / "config.pbtxt", re.escape(old), new)
    return model


def _explicit(models: Path) -> tuple[str, ...]:
    return (f"--model-repository={models}", "--model-control-mode=explicit")


def _concurrent_loads(qa: QA, here: Path) -> None:
    """test_concurrent_model_load_speedup, _load and _load_unload: models whose load
    takes 10 s (identity's creation_delay_sec, a Python model's sleep in initialize)."""
    identity = here / "identity_zero_1_int32"
    (models,) = _fresh(here, "models")
    for k in (1, 2):
        model = qa.copy(identity, models / f"identity_zero_1_int32_{k}")
        (model / "1").mkdir(exist_ok=True)
        _renamed(model, "identity_zero_1_int32", f"identity_zero_1_int32_{k}")
        python = _python_model(qa, "identity_fp32", models / f"python_identity_fp32_{k}",
                               append=_sleep_in_initialize(10))  # fmt: skip
        _renamed(python, "identity_fp32", f"python_identity_fp32_{k}")
    _case(qa, here, "test_concurrent_model_load_speedup", _explicit(models))
    models, models_v2 = _fresh(here, "models", "models_v2")
    model = qa.copy(identity, models / "identity_model")
    (model / "1").mkdir(exist_ok=True)
    _renamed(model, "identity_zero_1_int32", "identity_model")
    python = _python_model(qa, "identity_fp32", models_v2 / "identity_model")
    _renamed(python, "identity_fp32", "identity_model")
    _case(qa, here, "test_concurrent_model_load", _explicit(models))
    (models,) = _fresh(here, "models")
    for name in ("identity_zero_1_int32", "ensemble_zero_1_float32"):
        (qa.copy(here / name, models / name) / "1").mkdir(exist_ok=True)
    custom = qa.copy(
        qa.qa / "custom_models" / "custom_zero_1_float32", models / "custom_zero_1_float32"
    )
    (custom / "1").mkdir(exist_ok=True)
    with (custom / "config.pbtxt").open("a") as f:
        f.write('parameters [\n{ key: "creation_delay_sec"; value: { string_value: "10" }}\n]\n')
    _case(qa, here, "test_concurrent_model_load_unload", _explicit(models))


@suite
def l0_lifecycle(qa: QA) -> None:
    import triton_qa_suites_lifecycle_identity as more  # (it imports this module's helpers)

    here = qa.suite("L0_lifecycle")
    _parse_error_noexit(qa, here)
    _port_collisions(qa, here)
    qa.not_run(SUITE, 2, "test_parse_error_modelfail(_nostrict)", _OPENVINO)
    qa.not_run(SUITE, 2, "test_parse_error_no_model_config and its log check", _OPENVINO)
    qa.not_run(SUITE, 1, "test_init_error_modelfail", _OPENVINO)
    qa.not_run(SUITE, 1, "test_parse_error_model_no_version", _PLAN)
    _ignored_versions(qa, here)
    _dynamic_load_unload(qa, here)
    qa.not_run(SUITE, 2, "test_dynamic_model_modify, test_dynamic_file_delete", _PLAN)
    qa.not_run(SUITE, 2, "test_multiple_model_repository_polling, _control", _OPENVINO)
    _model_control(qa, here)
    qa.not_run(SUITE, 2, "test_multiple_model_repository_control_startup_models (2 runs)", _PLAN)
    _startup_refusals(qa, here)
    qa.not_run(SUITE, 1, "test_model_repository_index", _PLAN)
    _identity_reloads(qa, here)
    qa.not_run(SUITE, 4, "test_load_same_model_different_platform (4 runs)", _PLAN)
    qa.not_run(SUITE, 4, "poll mode: load/unload refused, model stays ready (curl)", _OPENVINO)
    _invalid_endpoints(qa, here)
    _overrides(qa, here)
    more.shutdowns(qa, here)
    _gpu_limit_flags(qa, here)
    qa.not_run(SUITE, 1, "test_load_gpu_limit", "a GPU and cuda-python (CUDA memory consumer)")
    _concurrent_loads(qa, here)
    more.load_unload_stress(qa, here)
    _concurrent_instances(qa, here)
    _load_retry(qa, here)
    _python_lifecycle(qa, here, more)
    qa.not_run(
        SUITE, 1, "test_shutdown_while_loading's log check",
        "it greps for the names of Triton's C++ functions (OnLoadFinal(), AsyncUnload())",
    )  # fmt: skip
    _custom_configs(qa, here)
    _new_model_version(qa, here)
