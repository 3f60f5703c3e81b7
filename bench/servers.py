"""Start and stop the servers a benchmark drives: shoal, or the real Triton via triton-peer.

``ServerProcess`` owns one child process group: it is started in its own session so that
``stop()`` can signal the server together with the helpers it spawned (Triton's python
backend stubs), and nothing else. shoal's broker, workers and frontends run in process groups
of their own and follow their parent out; ``stop()`` notes their pids beforehand and kills any
that linger, by pid, then removes the ``/dev/shm/shoal-<pid>-*`` files those pids left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
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


def free_port_block(count: int = 3, start: int = 10000, stop: int = 32768) -> int:
    """A base port such that ``base .. base+count-1`` are all free now. Below the kernel's
    usual ephemeral range (32768+), so no client connection takes one before the server
    binds it."""
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

    def __init__(
        self,
        name: str,
        argv: list[str],
        http_url: str,
        log_path: Path,
        grpc_url: str | None = None,
        frontends: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.env = env
        self.argv = argv
        self.http_url = http_url
        self.grpc_url = grpc_url
        self.frontends = frontends
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, protocol: str) -> str:
        """The address perf_analyzer's ``-u`` takes for ``http``, ``grpc``, ``grpc-stream``."""
        if protocol == "http":
            return self.http_url
        if self.grpc_url is None:
            raise ValueError(f"{self.name} serves no gRPC")
        return self.grpc_url

    def start(self, ready_timeout_s: float) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if self.env is None else {**os.environ, **self.env},
        )
        log.close()
        try:
            wait_ready(self.http_url, ready_timeout_s, self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session made the child its group's leader
        helpers = descendants(pgid)
        if self.proc.poll() is None:
            try:
                os.killpg(pgid, signal.SIGTERM)
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        with contextlib.suppress(ProcessLookupError):  # stragglers in the group
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        while any(_alive(p) for p in helpers) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in helpers:
            if _alive(p):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
        for p in [pgid, *helpers]:
            for f in Path("/dev/shm").glob(f"shoal-{p}-*"):
                f.unlink(missing_ok=True)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def descendants(root: int) -> list[int]:
    """Live processes below ``root`` by parent pid, plus those naming it in ``--parent-pid``.

    shoal's helpers carry ``--parent-pid``, so they stay recognisable once re-parented.
    """
    parent: dict[int, int] = {}
    by_flag: list[int] = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(d.name)
        parent[pid] = int(stat.rsplit(")", 1)[1].split()[1])
        for i, a in enumerate(argv[:-1]):
            if a == b"--parent-pid" and argv[i + 1] == str(root).encode():
                by_flag.append(pid)
    found: set[int] = set(by_flag)
    frontier = [root, *by_flag]
    while frontier:
        p = frontier.pop()
        for child, pp in parent.items():
            if pp == p and child not in found and child != root:
                found.add(child)
                frontier.append(child)
    return sorted(found)


def shoal_server(
    repo: Path, log_path: Path, frontends: int = 1, extra: tuple[str, ...] = ()
) -> ServerProcess:
    """``shoal serve`` on three free loopback ports with ``--frontend-processes frontends``
    (and the flags in ``extra``)."""
    base = free_port_block(3)
    shoal = REPO_ROOT / ".venv" / "bin" / "shoal"
    argv = [
        str(shoal),
        "serve",
        *("--model-repository", str(repo)),
        *("--http-address", "127.0.0.1", "--http-port", str(base)),
        *("--grpc-address", "127.0.0.1", "--grpc-port", str(base + 1)),
        *("--metrics-port", str(base + 2)),
        *("--frontend-processes", str(frontends)),
        *extra,
    ]
    return ServerProcess(
        f"shoal-{frontends}f",
        argv,
        f"127.0.0.1:{base}",
        log_path,
        grpc_url=f"127.0.0.1:{base + 1}",
        frontends=frontends,
    )


def noop_server(repo: Path, log_path: Path) -> ServerProcess:
    """bench/noop_server.py (shoal's stack answering at once, nothing behind it) for the
    models of ``repo``, on two free loopback ports."""
    base = free_port_block(2)
    argv = [
        sys.executable,
        str(REPO_ROOT / "bench" / "noop_server.py"),
        *("--model-repository", str(repo)),
        *("--http-port", str(base), "--grpc-port", str(base + 1)),
    ]
    return ServerProcess("noop", argv, f"127.0.0.1:{base}", log_path, f"127.0.0.1:{base + 1}")


def ensure_triton_peer_installed() -> None:
    if not (PEER_VENV / "bin" / "python").exists():
        subprocess.run([str(TRITON_PEER), "install"], check=True)


def triton_python_server(repo: Path, log_path: Path) -> ServerProcess:
    """The real tritonserver (triton-peer's build) on a repository of Python models as
    they are, on three free ports. Its Python stub ignores $PYTHONPATH: a model that
    imports numpy must put the $PYTHONPATH entries on sys.path itself."""
    ensure_triton_peer_installed()
    python = PEER_VENV / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    ts = Path(site) / "pytriton" / "tritonserver"
    stub = ts / "backends" / "python" / "triton_python_backend_stub"
    if not stub.exists():  # as triton-peer installs it
        stub.write_bytes((ts / "python_backend_stubs" / "3.11" / stub.name).read_bytes())
        stub.chmod(0o755)
    base = free_port_block(3)
    argv = [
        str(ts / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={ts / 'backends'}",
        f"--cache-directory={ts / 'caches'}",
        *("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"),
        *(f"--http-port={base}", f"--grpc-port={base + 1}", f"--metrics-port={base + 2}"),
        "--pinned-memory-pool-byte-size=0",
    ]
    env = {"LD_LIBRARY_PATH": f"{site}/nvidia_pytriton.libs", "PYTHONPATH": site}
    return ServerProcess(
        "triton", argv, f"127.0.0.1:{base}", log_path, grpc_url=f"127.0.0.1:{base + 1}", env=env
    )


def python_server(name: str, repo: Path, raw: Path) -> ServerProcess:
    """``name`` "triton": tritonserver on the repository's Python models as they are
    (``triton_python_server``); else shoal on it, named ``name``. Logs in ``raw``."""
    if name == "triton":
        return triton_python_server(repo, raw / "triton.log")
    srv = shoal_server(repo, raw / f"{name}.log")
    srv.name = name
    return srv


def triton_peer_server(repo: Path, log_path: Path, tmpdir: Path | None = None) -> ServerProcess:
    """triton-peer on three free ports; ``tmpdir`` (its ``$TMPDIR``) gets the shadow repository
    it builds, so a caller that removes ``tmpdir`` afterwards leaves nothing in /tmp."""
    ensure_triton_peer_installed()
    base = free_port_block(3)  # triton-peer takes HTTP, HTTP+1 (gRPC), HTTP+2 (metrics)
    argv = [str(TRITON_PEER), "serve", str(repo), str(base)]
    return ServerProcess(
        "triton",
        argv,
        f"127.0.0.1:{base}",
        log_path,
        grpc_url=f"127.0.0.1:{base + 1}",
        env=None if tmpdir is None else {"TMPDIR": str(tmpdir)},
    )
