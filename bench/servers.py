"""Start and stop the servers a benchmark drives: shoal, or the real Triton via triton-peer.

``ServerProcess`` owns one child process group: it is started in its own session so that
``stop()`` can signal the server together with the helpers it spawned (Triton's python
backend stubs, shoal's broker and workers), and nothing else.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TRITON_PEER = REPO_ROOT.parent / "shared" / "tools" / "triton-peer" / "triton-peer"
PEER_VENV = (
    Path(os.environ.get("SHOAL_TOOLS", Path.home() / ".cache" / "shoal-tools"))
    / "triton-peer"
    / "venv"
)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_block(count: int = 3, start: int = 20000, stop: int = 60000) -> int:
    """A base port such that ``base .. base+count-1`` are all free now (racy, good enough)."""
    rng = int.from_bytes(os.urandom(2), "little")
    for i in range(2000):
        base = start + (rng + i * 7) % (stop - start - count)
        if all(_port_free(base + k) for k in range(count)):
            return base
    raise RuntimeError("no free port block found")


def wait_ready(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``http://url/v2/health/ready`` until 200; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before ready")
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
                last = f"HTTP {r.status}"
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.25)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f}s ({last})")


class ServerProcess:
    """One server child process group, its log file and the HTTP address it serves."""

    def __init__(self, name: str, argv: list[str], http_url: str, log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.http_url = http_url
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout_s: float) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        try:
            wait_ready(self.http_url, ready_timeout_s, self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session made the child its group's leader
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def shoal_server(repo: Path, log_path: Path) -> ServerProcess:
    base = free_port_block(3)
    shoal = REPO_ROOT / ".venv" / "bin" / "shoal"
    argv = [
        str(shoal),
        "serve",
        "--model-repository",
        str(repo),
        "--http-port",
        str(base),
        "--grpc-port",
        str(base + 1),
        "--metrics-port",
        str(base + 2),
    ]
    return ServerProcess("shoal", argv, f"127.0.0.1:{base}", log_path)


def ensure_triton_peer_installed() -> None:
    if not (PEER_VENV / "bin" / "python").exists():
        subprocess.run([str(TRITON_PEER), "install"], check=True)


def triton_peer_server(repo: Path, log_path: Path) -> ServerProcess:
    ensure_triton_peer_installed()
    base = free_port_block(3)  # triton-peer takes HTTP, HTTP+1 (gRPC), HTTP+2 (metrics)
    argv = [str(TRITON_PEER), "serve", str(repo), str(base)]
    return ServerProcess("triton", argv, f"127.0.0.1:{base}", log_path)
