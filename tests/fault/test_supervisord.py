"""shoal under a real supervisord, running the configuration ``shoal supervisord-conf``
prints: every role killed in turn comes back, one model's workers stop and start while
another model serves, and a shutdown leaves no process and no /dev/shm segment."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serverctl import RUN_PREFIX, free_ports, processes_with, shm_segments_of
from tools import modelgen

BIN = Path(sys.executable).parent
SUPERVISORD = BIN / "supervisord"
SUPERVISORCTL = BIN / "supervisorctl"
OTHER = modelgen.SIMPLE_CONFIG.replace('name: "simple"', 'name: "other"')


class Supervised:
    """supervisord running a generated configuration for ``repo`` on free ports, all its
    files in one temporary folder (whose name every process's command line carries)."""

    def __init__(self, repo: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=RUN_PREFIX))
        (self.dir / "logs").mkdir()
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        generated = subprocess.run(
            [
                sys.executable, "-m", "shoal", "supervisord-conf",
                f"--model-repository={repo}",
                f"--supervisor-dir={self.dir}",
                f"--log-dir={self.dir / 'logs'}",
                "--http-address=127.0.0.1",
                f"--http-port={self.http_port}",
                f"--grpc-port={self.grpc_port}",
                f"--metrics-port={self.metrics_port}",
                "--exit-timeout-secs=5",
                "--frontend-silence-timeout-secs=3",
            ],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        self.conf = self.dir / "supervisord.conf"
        self.conf.write_text(generated.stdout)
        self.proc = subprocess.Popen(
            [str(SUPERVISORD), "-n", "-c", str(self.conf)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.seen: set[int] = {self.proc.pid}

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted((self.dir / "logs").iterdir())
        )

    def ctl(self, *args: str) -> str:
        done = subprocess.run(
            [str(SUPERVISORCTL), "-c", str(self.conf), *args],
            capture_output=True,
            text=True,
            timeout=90,
        )
        return done.stdout + done.stderr

    def pid(self, process: str) -> int:
        """The pid supervisord gives for ``process`` (group:name, or a lone program)."""
        out = self.ctl("pid", process).strip()
        assert out.isdigit() and out != "0", f"{process}: {out}"
        self.seen.add(int(out))
        return int(out)

    def note_pids(self) -> None:
        self.seen |= set(processes_with(str(self.dir)))

    def ready(self, path: str = "/v2/health/ready") -> bool:
        try:
            url = f"http://127.0.0.1:{self.http_port}{path}"
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(r.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait(self, path: str = "/v2/health/ready", want: bool = True, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready(path) == want:
                self.note_pids()
                return
            assert self.proc.poll() is None, f"supervisord exited\n{self.logs()}"
            time.sleep(0.1)
        pytest.fail(f"{path} did not turn {want} in {timeout}s\n{self.logs()}")

    def shutdown(self) -> list[str]:
        """``supervisorctl shutdown``; what is left after it (processes, segments)."""
        self.note_pids()
        if self.proc.poll() is None:
            self.ctl("shutdown")
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        deadline = time.monotonic() + 5
        while True:
            procs = processes_with(str(self.dir))
            segments = shm_segments_of(self.seen)
            if (not procs and not segments) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for pid in procs:  # (reported below; not left to the rest of the run)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return [f"process {p}: {c}" for p, c in procs.items()] + [f"/dev/shm/{s}" for s in segments]


@pytest.fixture(scope="module")
def supervised(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    repo = tmp_path_factory.mktemp("repo")
    modelgen.write_model(repo, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    modelgen.write_model(repo, "other", modelgen.simple_model(), OTHER)
    s = Supervised(repo)
    try:
        s.wait()
        yield s
    finally:
        left = s.shutdown()
        logs = s.logs()
        shutil.rmtree(s.dir, ignore_errors=True)
        assert not left, f"left behind: {left}\n{logs}"


def _inputs(module: object) -> list[object]:
    ins = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return ins


def _infer(s: Supervised, model: str = "simple") -> np.ndarray:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{s.http_port}", network_timeout=10)
    try:
        return client.infer(model, _inputs(httpclient)).as_numpy("OUTPUT0")
    finally:
        client.close()


def _recovery(s: Supervised, model: str = "simple", timeout: float = 120) -> float:
    """Seconds from now until ``model`` answers a request right again."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        with contextlib.suppress(Exception):
            if (_infer(s, model) == 2).all():
                s.note_pids()
                return time.monotonic() - start
        time.sleep(0.05)
    pytest.fail(f"{model} did not answer again in {timeout}s\n{s.logs()}")


def test_a_generated_configuration_serves_http_and_grpc(supervised: Supervised) -> None:
    np.testing.assert_array_equal(_infer(supervised), np.full((1, 16), 2))
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{supervised.grpc_port}")
    result = client.infer("other", _inputs(grpcclient))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2))
    client.close()
    status = supervised.ctl("status")
    for program in ("shoal-broker", "shoal-frontend", "shoal-worker-simple-v1"):
        assert f"{program}" in status and "RUNNING" in status, status


def test_a_killed_worker_frontend_and_broker_each_come_back(
    supervised: Supervised, capsys: pytest.CaptureFixture[str]
) -> None:
    times: dict[str, float] = {}
    for role, process in (
        ("worker", "shoal-worker-simple-v1:shoal-worker-simple-v1_0"),
        ("frontend", "shoal-frontend:shoal-frontend_0"),
        ("broker", "shoal-broker"),
    ):
        pid = supervised.pid(process)
        supervised.note_pids()
        os.kill(pid, signal.SIGKILL)
        times[role] = _recovery(supervised)
        assert supervised.pid(process) != pid, f"{role} was not restarted"
        supervised.wait()
    with capsys.disabled():
        print(
            "\nrecovery under supervisord (SIGKILL to the first request answered again): "
            + ", ".join(f"{role} {seconds:.2f} s" for role, seconds in times.items())
        )


def test_a_stuck_frontend_is_killed_by_the_broker_and_started_again(
    supervised: Supervised, capsys: pytest.CaptureFixture[str]
) -> None:
    """As under shoal serve (tests/fault/test_stuck_frontend.py): the broker kills a
    frontend that has sent it nothing for --frontend-silence-timeout-secs (3 s here),
    and supervisord starts another (a SIGKILL is an unexpected exit)."""
    process = "shoal-frontend:shoal-frontend_0"
    pid = supervised.pid(process)
    supervised.note_pids()
    os.kill(pid, signal.SIGSTOP)
    try:
        back = _recovery(supervised)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert supervised.pid(process) != pid
    broker_log = "".join(p.read_text(errors="replace") for p in (supervised.dir / "logs").iterdir())
    assert f"(pid {pid}) sent nothing for 3s: stuck; killing it" in broker_log, supervised.logs()
    with capsys.disabled():
        print(f"\nstuck frontend under supervisord (SIGSTOP): answering again after {back:.2f} s")


def test_one_models_workers_stop_and_start_while_another_model_serves(
    supervised: Supervised,
) -> None:
    failures: list[str] = []
    answered = 0
    done = threading.Event()

    def serve_other() -> None:
        nonlocal answered
        while not done.is_set():
            try:
                assert (_infer(supervised, "other") == 2).all()
                answered += 1
            except Exception as exc:  # recorded and asserted below
                failures.append(repr(exc))
            time.sleep(0.02)

    thread = threading.Thread(target=serve_other)
    thread.start()
    try:
        out = supervised.ctl("stop", "shoal-worker-simple-v1:*")
        assert "stopped" in out, out
        supervised.wait("/v2/models/simple/ready", want=False, timeout=30)
        supervised.wait("/v2/models/other/ready", want=True, timeout=5)
        assert not supervised.ready()  # strict readiness: a model is not ready
        out = supervised.ctl("start", "shoal-worker-simple-v1:*")
        assert "started" in out, out
        supervised.wait("/v2/models/simple/ready", want=True)
        np.testing.assert_array_equal(_infer(supervised), np.full((1, 16), 2))
    finally:
        done.set()
        thread.join(30)
    assert not failures, failures[:5]
    assert answered > 0


def test_shutdown_leaves_no_process_and_no_segment(supervised: Supervised) -> None:
    assert supervised.shutdown() == []
    assert supervised.proc.returncode == 0


def test_a_broker_whose_models_fail_to_load_is_not_started_again_and_again(
    tmp_path: Path,
) -> None:
    """--exit-on-error (the default): the broker exits with the code that says a restart
    would fail the same way, and supervisord leaves it stopped (no restart loop)."""
    modelgen.write_model(
        tmp_path,
        "broken",
        modelgen.simple_model(),
        'name: "broken"\nplatform: "onnxruntime_onnx"\nmax_batch_size: -3\n',
    )
    s = Supervised(tmp_path)
    try:
        deadline = time.monotonic() + 60
        status = ""
        while time.monotonic() < deadline:
            status = s.ctl("status", "shoal-broker")
            if "EXITED" in status:
                break
            time.sleep(0.2)
        assert "EXITED" in status, f"{status}\n{s.logs()}"
        time.sleep(2.0)
        assert "EXITED" in s.ctl("status", "shoal-broker")  # not started again
        assert "model(s) failed to load" in s.logs()
        assert not s.ready()
    finally:
        left = s.shutdown()
        logs = s.logs()
        shutil.rmtree(s.dir, ignore_errors=True)
    assert not left, f"left behind: {left}\n{logs}"
