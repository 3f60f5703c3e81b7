"""Shared fixtures: a model repository built for the tests and real servers on it."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient

from tests.serverctl import SHM_DIR, ShoalServer, finish_logs, processes_with
from tools import modelgen

# The tests reach nothing off this machine: google-auth (gcsfs's, in this process and in
# the servers, which inherit this environment) does not probe a cloud metadata server,
# and gcsfs does not ask Google's control API a bucket's type. Both read these once, when
# first imported: set before any test module is.
os.environ["NO_GCE_CHECK"] = "true"
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

ALL_DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
]
_CONFIG_TYPE = {"BYTES": "TYPE_STRING"}


def identity_config(name: str, datatype: str, dims: str, max_batch_size: int) -> str:
    t = _CONFIG_TYPE.get(datatype, f"TYPE_{datatype}")
    return f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: {t} dims: {dims} }} ]
output [ {{ name: "OUTPUT0" data_type: {t} dims: {dims} }} ]
"""


def build_test_repository(repo: Path) -> Path:
    """``simple``, ``mlp``, an identity model per datatype, and a few special cases."""
    modelgen.write_shipped_repository(repo)
    for dt in ALL_DATATYPES:
        name = f"identity_{dt.lower()}"
        modelgen.write_model(
            repo,
            name,
            modelgen.identity_model(dt, [-1], batch=True),
            identity_config(name, dt, "[ -1 ]", 8),
        )
    # Not batching, one variable dim: the raw binary request's model.
    modelgen.write_model(
        repo,
        "identity_nobatch",
        modelgen.identity_model("FP32", [-1], batch=False),
        identity_config("identity_nobatch", "FP32", "[ -1 ]", 0),
    )
    # No config.pbtxt at all: everything comes from auto-complete.
    modelgen.write_model(repo, "simple_autofill", modelgen.simple_model(), None)
    # Three versions; the default policy (latest 1) serves only version 3.
    for v in (1, 2, 3):
        modelgen.write_model(repo, "versioned", modelgen.simple_model(), None, version=v)
    (repo / "versioned" / "config.pbtxt").write_text(
        'name: "versioned"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        "version_policy: { specific: { versions: [1, 3] } }\n"
    )
    (repo / "not_a_model_dir_file.txt").write_text("ignored")
    return repo


def _close_on_the_main_thread_only() -> None:
    """tritonclient's HTTP client closes itself in ``__del__``, joining a gevent pool;
    the cycle collector may run that on any thread, and on one without a gevent hub
    it fails and pytest reports an unraisable exception at whichever test is running.
    Off the main thread the collector now just drops the client (its connections close
    with it); a test that closes its clients itself is unaffected."""
    original = httpclient.InferenceServerClient.__del__

    def __del__(self: httpclient.InferenceServerClient) -> None:
        if threading.current_thread() is threading.main_thread():
            original(self)

    httpclient.InferenceServerClient.__del__ = __del__  # type: ignore[method-assign]


_close_on_the_main_thread_only()


# The modules that take longest (model compiles, many server starts), first: pytest-xdist
# (with --no-loadscope-reorder) hands out modules in this order, so the two processes
# end together instead of one running a late slow module alone. Then the other
# integration modules, then the unit tests, short ones that fill the gaps at the end.
_SLOWEST_FIRST = (
    "test_torch_pt2.py",
    "test_process_faults.py",  # the fault tests mostly wait: they fill the others' gaps
    "test_triton_flags.py",
    "test_tf_backend.py",  # (not at once with the compile above: both need the cores)
    "test_server_lifecycle.py",
    "test_torch_backend.py",
    "test_model_control.py",
    "test_object_storage_emulators.py",
    "test_client_shm.py",
    "test_batching.py",
    "test_object_storage.py",
    "test_openvino_backend.py",
    "test_instance_limits.py",
    "test_model_control_races.py",
    "test_generative.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_SLOWEST_FIRST)}
    last = len(rank)

    def key(item: pytest.Item) -> tuple[int, int]:
        if "unit" in item.path.parts:
            return (2, last)
        return (0, rank[item.path.name]) if item.path.name in rank else (1, last)

    items.sort(key=key)  # stable: a module's tests keep their order
    for item in items:  # a measurement is judged with no other test beside it
        if "measured" in item.path.parts:
            item.add_marker(pytest.mark.serial)


_KEPT_LOGS = pytest.StashKey[Path]()
_SEGMENTS_BEFORE = pytest.StashKey[set[str]]()
_LEFT_BEHIND = pytest.StashKey[list[str]]()


def _shoal_segments() -> set[str]:
    return {p.name for p in SHM_DIR.iterdir() if p.name.startswith("shoal-")}


def _runs_tests_itself(config: pytest.Config) -> bool:
    """False in pytest-xdist's controller, which starts no server: its workers do."""
    return hasattr(config, "workerinput") or not config.getoption("numprocesses", None)


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the whole run's start
        session.config.stash[_SEGMENTS_BEFORE] = _shoal_segments()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The servers' logs go with a run that passed; a failed run keeps them. After the
    whole run (in xdist's controller, once every worker is done, so that no test still
    running elsewhere is judged): no shoal process and no shoal /dev/shm segment remain."""
    if _runs_tests_itself(session.config):
        kept = finish_logs(keep=exitstatus != 0)
        if kept is not None:
            session.config.stash[_KEPT_LOGS] = kept
    if hasattr(session.config, "workerinput"):
        return
    if left := _left_behind(session.config.stash[_SEGMENTS_BEFORE]):
        session.config.stash[_LEFT_BEHIND] = left
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _left_behind(before: set[str]) -> list[str]:
    """This checkout's test servers' processes (its interpreter's: a suite run from another
    checkout at the same time has its own), and new segments whose owner is dead (servers
    outside the suite may be running)."""
    venv = str(Path(sys.executable).parent.parent)
    procs = {pid: cmd for pid, cmd in processes_with("shoal-test-run-").items() if venv in cmd}
    segments = {
        name for name in _shoal_segments() if not Path(f"/proc/{name.split('-')[1]}").exists()
    }
    return [f"process left behind: {p} {c}" for p, c in procs.items()] + [
        f"/dev/shm segment left behind: {name}" for name in sorted(segments - before)
    ]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    for line in config.stash.get(_LEFT_BEHIND, []):
        terminalreporter.write_line(line, red=True)
    kept = config.stash.get(_KEPT_LOGS, None)
    if kept is not None:
        terminalreporter.write_line(f"shoal server logs of this run: {kept}")


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="session")
def server(model_repo: Path) -> Iterator[ShoalServer]:
    """One server for the read-mostly integration tests (fault tests start their own)."""
    srv = ShoalServer(model_repo)
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)
