"""Triton's own QA suites (``qa/L0_*`` of a Triton server source tree) against shoal.

Each suite's ``test.sh`` generates models with ``qa/common/gen_qa_*.py``, starts
``tritonserver`` with given flags and runs Python tests (tritonclient against
localhost:8000/8001). This runner does the same with shoal in tritonserver's place, for
the parts of each suite whose models shoal serves (ONNX, TorchScript, Python; CPU):

- the qa tree is copied into a temporary folder (nothing is written to the source tree,
  and no Triton file enters this project);
- model repositories are built there at run time with Triton's own generators (ONNX
  only) and the same copies and edits each test.sh makes;
- a fresh ``shoal serve`` is started wherever test.sh starts a fresh tritonserver, with
  the same flags (less the ones about Triton's own install: backend directory, ...);
- each test file runs as test.sh runs it (``python <file> [Class[.test]]``, in the
  suite's folder, with its environment), and unittest's summary gives passed/total.

Run it through ``scripts/triton-qa.sh``, which gives it a network namespace of its own:
the tests dial localhost:8000, 8001 and 8002, whatever else runs on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
#: What the QA tests import beyond tritonclient (requests, sseclient-py, psutil):
#: triton-qa.sh installs them there, outside the venv, before the network goes away.
DEPS_DIR = Path(os.environ.get("SHOAL_QA_DEPS", "deps"))

#: How long a start may take, in seconds: util.sh's SERVER_TIMEOUT (its default 120; a
#: few hundred workers starting on a small, busy machine may need more).
SERVER_TIMEOUT = float(os.environ.get("SERVER_TIMEOUT", "120"))

#: Generated repositories: the folder test.sh finds under $DATADIR, and the generator
#: call (``qa/common`` script, flags) that makes it.
GENERATED: dict[str, tuple[str, ...]] = {
    "qa_model_repository": ("gen_qa_models.py", "--onnx", "--libtorch"),
    "qa_ensemble_model_repository/qa_model_repository": ("gen_qa_models.py", "--ensemble"),
    "qa_variable_model_repository": ("gen_qa_models.py", "--onnx", "--variable"),
    "qa_identity_model_repository": ("gen_qa_identity_models.py", "--onnx"),
    "qa_sequence_model_repository": ("gen_qa_sequence_models.py", "--onnx"),
    "qa_variable_sequence_model_repository": ("gen_qa_sequence_models.py", "--onnx", "--variable"),
    "qa_dyna_sequence_model_repository": ("gen_qa_dyna_sequence_models.py", "--onnx"),
    "qa_dyna_sequence_implicit_model_repository": (
        "gen_qa_dyna_sequence_implicit_models.py",
        "--onnx",
    ),
    "qa_sequence_implicit_model_repository": ("gen_qa_implicit_models.py", "--onnx"),
    "qa_variable_sequence_implicit_model_repository": (
        "gen_qa_implicit_models.py",
        "--onnx",
        "--variable",
    ),
    "qa_reshape_model_repository": ("gen_qa_reshape_models.py", "--onnx", "--variable"),
}


#: qa/common/shm_util.py's leak probe imports ``triton_shm_monitor`` (a C++ extension of
#: Triton's CI build) to watch /dev/shm/triton_python_backend_shm_region_*: the regions
#: of Triton's Python-backend stubs. shoal runs Python models in its workers and makes no
#: such region, so the probe finds none to watch; this stand-in lets it import.
_SHM_MONITOR = """class SharedMemoryManager:
    def __init__(self, name):
        raise RuntimeError(f"shoal makes no Python backend region; found {name}")
"""


@dataclass
class Tally:
    """passed/total of one suite, what its lines were, and how many tests it left out."""

    passed: int = 0
    total: int = 0
    not_run: int = 0
    lines: list[str] = field(default_factory=list)


#: How a server start waits, as qa/common/util.sh's functions: ``ready`` (run_server:
#: GET /v2/health/ready answers 200), ``started`` (run_server_nowait then test.sh's
#: sleep: any HTTP answer on port 8000) or ``none`` (not at all).
Wait = Literal["ready", "started", "none"]


@dataclass
class Server:
    """A ``shoal serve`` started by QA.server: its process, its log, and whether it came
    up as its start waited for."""

    proc: subprocess.Popen[bytes]
    log: Path
    up: bool


class QA:
    """One run: the copied qa tree, its generated data, and shoal servers started in it."""

    def __init__(self, triton: Path, work: Path, verbose: bool) -> None:
        self.work = work
        self.qa = work / "qa"
        self.data = work / "data"
        self.verbose = verbose
        shutil.copytree(triton / "qa", self.qa, symlinks=True)
        # docs/examples' models less the two that docs/examples/fetch_models.sh downloads
        # (densenet_onnx, inception_onnx: no version folder here, offline)
        self.examples = work / "examples"
        for model in (triton / "docs" / "examples" / "model_repository").iterdir():
            if any(v.name.isdigit() for v in model.iterdir()):
                shutil.copytree(model, self.examples / model.name, symlinks=True)
        self.tally: dict[str, Tally] = {}
        self.env = dict(os.environ)
        stubs = work / "stubs"
        stubs.mkdir()
        (stubs / "triton_shm_monitor.py").write_text(_SHM_MONITOR)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(DEPS_DIR), str(self.qa / "common"), str(stubs)]
        )

    # -- models -------------------------------------------------------------------------

    def generated(self, name: str) -> Path:
        """``$DATADIR/<name>``, generated on first use."""
        out = self.data / name
        if not out.exists():
            script, *flags = GENERATED[name]
            subprocess.run(
                [str(PYTHON), script, *flags, f"--models_dir={out}"],
                cwd=self.qa / "common",
                env=self.env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        return out

    def suite(self, name: str) -> Path:
        """The suite's folder, with ``models/`` holding docs/examples' model repository
        (Triton's CI puts it there before it runs a test.sh)."""
        here = self.qa / name
        self.copy(self.examples, here / "models")
        return here

    @staticmethod
    def fresh(path: Path) -> Path:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    @staticmethod
    def copy(src: Path, dst: Path) -> Path:
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
        return dst

    @staticmethod
    def sed(path: Path, pattern: str, repl: str, count: int = 0) -> None:
        """``sed -i s/pattern/repl/[g]`` (``count`` 1: the first match in the file)."""
        path.write_text(re.sub(pattern, repl, path.read_text(), count=count, flags=re.M))

    # -- servers and tests --------------------------------------------------------------

    @contextlib.contextmanager
    def serve(
        self, cwd: Path, *args: str, log: str = "server", env: dict[str, str] | None = None
    ) -> Iterator[bool]:
        """A fresh ``shoal serve`` with tritonserver's flags (and test.sh's exports in
        ``env``), as util.sh's run_server: yields whether it became ready (GET
        /v2/health/ready) within ``SERVER_TIMEOUT``."""
        with self.server(cwd, *args, log=log, env=env) as server:
            yield server.up

    @contextlib.contextmanager
    def server(
        self,
        cwd: Path,
        *args: str,
        log: str = "server",
        env: dict[str, str] | None = None,
        wait: Wait = "ready",
    ) -> Iterator[Server]:
        """A fresh ``shoal serve`` (as ``serve``), waited for as ``wait`` says; stopped
        with SIGINT (and its exit waited for) when the block ends. Its log is
        ``<log>.shoal.log``, or ``log`` itself where it names a ``.log`` file (a test
        that reads test.sh's SERVER_LOG by its name)."""
        path = cwd / (log if log.endswith(".log") else f"{log}.shoal.log")
        logfile = path.open("w")
        cmd = [str(PYTHON), "-m", "shoal", "serve", *args]
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        try:
            up = True if wait == "none" else _answers(proc, wait == "ready")
            yield Server(proc, path, up)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            logfile.close()

    def test(
        self, suite: str, cwd: Path, file: str, *names: str, note: str | None = None, **env: str
    ) -> None:
        """``python <file> <names>`` in ``cwd``; its unittest summary counts to ``suite``
        (its line says ``note``, else the environment given)."""
        run = subprocess.run(
            [str(PYTHON), file, *names],
            cwd=cwd,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=3600,
        )
        passed, total = _summary(run.stdout + run.stderr)
        said = [f"{k}={v}" for k, v in env.items()] if note is None else [note] if note else []
        what = " ".join([file, *names, *said])
        self.count(suite, passed, total, what)
        log = cwd / "client.log"
        with log.open("a") as f:
            f.write(f"=== {what}\n{run.stdout}{run.stderr}")
        if self.verbose and passed < total:
            print(run.stdout + run.stderr, file=sys.stderr)

    def pytest(self, suite: str, cwd: Path, target: str, *, note: str = "", **env: str) -> None:
        """``python -m pytest <target>`` in ``cwd`` (``file`` or ``file::Class::test``), as
        test.sh runs it; pytest's summary counts to ``suite``."""
        run = subprocess.run(
            [str(PYTHON), "-m", "pytest", "-p", "no:cacheprovider", target],
            cwd=cwd,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=3600,
        )
        passed, total = _pytest_summary(run.stdout + run.stderr)
        what = " ".join(w for w in (target, note) if w)
        self.count(suite, passed, total, what)
        with (cwd / "client.log").open("a") as f:
            f.write(f"=== {what}\n{run.stdout}{run.stderr}")
        if self.verbose and passed < total:
            print(run.stdout + run.stderr, file=sys.stderr)

    def run_check(self, cwd: Path, args: Sequence[str]) -> bool:
        """``python <args>`` in ``cwd`` (a checker script of the suite's): whether it exited
        0; its output goes to ``client.log``."""
        run = subprocess.run(
            [str(PYTHON), *args], cwd=cwd, env=self.env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        with (cwd / "client.log").open("a") as f:
            f.write(f"=== {' '.join(args)}\n{run.stdout}{run.stderr}")
        return run.returncode == 0

    def count(self, suite: str, passed: int, total: int, what: str) -> None:
        t = self.tally.setdefault(suite, Tally())
        t.passed += passed
        t.total += total
        t.lines.append(f"{passed}/{total} {what}")
        print(f"  {suite}: {passed}/{total} {what}", flush=True)

    def not_ready(self, suite: str, total: int, what: str) -> None:
        self.count(suite, 0, total, f"{what} (server not ready)")

    def not_run(self, suite: str, count: int, what: str, why: str) -> None:
        """``count`` tests or checks of test.sh left out (counted apart), and why."""
        t = self.tally.setdefault(suite, Tally())
        t.not_run += count
        t.lines.append(f"not run ({count}) {what}: {why}")
        print(f"  {suite}: not run ({count}) {what}: {why}", flush=True)

    def served_test(
        self,
        suite: str,
        cwd: Path,
        serve_args: Sequence[str],
        file: str,
        name: str,
        *,
        log: str,
        what: str,
        note: str | None = None,
        serve_env: dict[str, str] | None = None,
        test_env: dict[str, str] | None = None,
    ) -> None:
        """One test of ``file`` against a fresh server (``serve``): its count to
        ``suite``, or one failure named ``what`` when the server never became ready."""
        with self.serve(cwd, *serve_args, log=log, env=serve_env) as ready:
            if ready:
                self.test(suite, cwd, file, name, note=note, **(test_env or {}))
            else:
                self.not_ready(suite, 1, what)


def _answers(proc: subprocess.Popen[bytes], ready: bool) -> bool:
    """Whether port 8000 answers GET /v2/health/ready with 200 (``ready``), else any
    HTTP status on /v2/health/live, within ``SERVER_TIMEOUT`` and while ``proc`` runs."""
    url = f"http://localhost:8000/v2/health/{'ready' if ready else 'live'}"
    deadline = time.monotonic() + SERVER_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except urllib.error.HTTPError:
            if not ready:
                return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def _summary(output: str) -> tuple[int, int]:
    """(passed, total) from unittest's last lines: "Ran N tests" then "OK" or "FAILED
    (failures=.., errors=..)"; skipped tests count as neither."""
    ran = re.findall(r"^Ran (\d+) tests? in", output, re.M)
    if not ran:
        return 0, 1
    total = int(ran[-1])
    tail = output[output.rfind("Ran ") :]
    bad = sum(int(n) for n in re.findall(r"(?:failures|errors|unexpected successes)=(\d+)", tail))
    # A test whose subtests fail counts one failure per subtest: count the tests.
    failed = set(re.findall(r"^(?:FAIL|ERROR): (\S+ \(\S+?\))", output, re.M))
    if failed:
        unexpected = sum(int(n) for n in re.findall(r"unexpected successes=(\d+)", tail))
        bad = min(bad, len(failed) + unexpected)
    skipped = sum(int(n) for n in re.findall(r"skipped=(\d+)", tail))
    return max(total - bad - skipped, 0), total - skipped


def _pytest_summary(output: str) -> tuple[int, int]:
    """(passed, total) from pytest's last line ("2 failed, 5 passed, 1 skipped in 3s");
    skipped tests count as neither, an error (setup, collection) as a failure."""
    lines = [line for line in output.splitlines() if re.search(r" in [\d.]+s", line)]
    if not lines:
        return 0, 1
    counts = {
        k: int(n)
        for n, k in re.findall(r"(\d+) (passed|failed|errors?|xfailed|xpassed)", lines[-1])
    }
    passed = counts.get("passed", 0) + counts.get("xfailed", 0)
    bad = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    bad += counts.get("xpassed", 0)
    return passed, passed + bad


SUITES: dict[str, Callable[[QA], None]] = {}


def suite(fn: Callable[[QA], None]) -> Callable[[QA], None]:
    SUITES[fn.__name__.replace("l0_", "L0_", 1)] = fn
    return fn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("triton", type=Path, help="a Triton server source tree (with qa/)")
    parser.add_argument("suites", nargs="*", help="suites to run (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--verbose", action="store_true", help="print failing tests' output")
    args = parser.parse_args()
    import triton_qa_suites  # noqa: F401  (registers the suites)
    import triton_qa_suites_batcher  # noqa: F401
    import triton_qa_suites_config  # noqa: F401
    import triton_qa_suites_decoupled  # noqa: F401
    import triton_qa_suites_lifecycle  # noqa: F401
    import triton_qa_suites_python  # noqa: F401
    import triton_qa_suites_sequence  # noqa: F401
    import triton_qa_suites_trace  # noqa: F401

    chosen = args.suites or list(SUITES)
    unknown = [s for s in chosen if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; known: {list(SUITES)}")
    if not (args.triton / "qa" / "common" / "test_util.py").exists():
        parser.error(f"{args.triton} has no qa/common/test_util.py")
    work = Path(tempfile.mkdtemp(prefix="shoal-triton-qa-"))
    print(f"work folder: {work}", flush=True)
    qa = QA(args.triton.resolve(), work, args.verbose)
    try:
        for name in chosen:
            print(f"{name}:", flush=True)
            SUITES[name](qa)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("\n| suite | passed/total | not run |\n|---|---|---|")
    for name in chosen:
        t = qa.tally.get(name, Tally())
        print(f"| {name} | {t.passed}/{t.total} | {t.not_run} |")
    return 0 if all(t.passed == t.total for t in qa.tally.values()) else 1


if __name__ == "__main__":
    import triton_qa  # the suites register with this module, not with __main__

    sys.exit(triton_qa.main())
