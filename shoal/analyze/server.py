"""The shoal server ``shoal analyze`` runs for itself: ``shoal serve`` as a child process
on free loopback ports, explicit model control with only the analysed model loaded. Each
point of the search is a load of that model with a config override (the repository API),
never a restart. Stopped (SIGTERM, then SIGKILL of its process group past a deadline) and
its runtime folder removed on exit, whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import tritonclient.grpc as grpcclient


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class AnalysisServer:
    def __init__(self, repo: Path, model: str, log_path: Path, extra: list[str]) -> None:
        self.model = model
        self.http_port, self.grpc_port, self.metrics_port = _free_ports(3)
        self.runtime_dir = tempfile.mkdtemp(prefix="shoal-analyze-")
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "shoal", "serve",
                f"--model-repository={repo}", "--model-control-mode=explicit",
                f"--load-model={model}", "--http-address=127.0.0.1",
                f"--http-port={self.http_port}", "--grpc-address=127.0.0.1",
                f"--grpc-port={self.grpc_port}", f"--metrics-port={self.metrics_port}",
                "--allow-metrics=false", f"--runtime-dir={self.runtime_dir}", *extra,
            ],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        self.client = grpcclient.InferenceServerClient(self.grpc_url)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def __enter__(self) -> AnalysisServer:
        try:
            self.wait_ready(120.0)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _log_tail(self) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-15:])

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited ({self.proc.returncode}):\n{self._log_tail()}"
                )
            try:
                if self.client.is_model_ready(self.model):
                    return
            except Exception:  # not listening yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the model did not load in {timeout_s:.0f} s:\n{self._log_tail()}"
                )
            time.sleep(0.1)  # polling a child process that has no readiness pipe

    def config(self) -> dict[str, Any]:
        """The loaded model's completed config (Triton's JSON form)."""
        return dict(self.client.get_model_config(self.model, as_json=True)["config"])

    def load(self, config: dict[str, Any]) -> None:
        """Load the model again with ``config`` (the call returns once it is loaded)."""
        self.client.load_model(self.model, config=json.dumps(config))

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
