"""An instance that hangs, or runs over its memory limit, is killed and restarted while
the rest serves; a busy worker lets go of slabs its frontend unlinked."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import identity_config
from tests.fault.conftest import metric, mlp_input, simple_inputs
from tests.serverctl import SHM_DIR, ShoalServer
from tools import modelgen


def test_a_hung_instance_is_killed_its_request_answered_and_it_comes_back(
    small_repo: Path,
) -> None:
    srv = ShoalServer(small_repo, "--model-execution-timeout-secs=1")
    try:
        client = httpclient.InferenceServerClient(srv.url, network_timeout=30)
        hung = srv.worker_pid("simple")
        os.kill(hung, signal.SIGSTOP)  # alive but never answering: a hang
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            client.infer("simple", simple_inputs())
        assert time.monotonic() - t0 < 10
        assert e.value.status() == "503"
        assert "had run one batch for" in srv.log()
        deadline = time.monotonic() + 30
        while not client.is_model_ready("simple") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert srv.worker_pid("simple") != hung
        reason = 'model="simple",reason="execution_timeout",version="1"'
        assert metric(srv, f"shoal_instance_exit_count{{{reason}}}") == 1
        np.testing.assert_array_equal(
            client.infer("simple", simple_inputs()).as_numpy("OUTPUT0"), np.full((1, 16), 2)
        )
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


@pytest.mark.parametrize("limit_from", ["flag", "config"])
def test_an_instance_over_its_memory_limit_is_killed_and_the_rest_keeps_serving(
    small_repo: Path, tmp_path: Path, limit_from: str
) -> None:
    """A model that runs away with memory inside a batch (over twice its limit): its
    instance is killed at once, the request it ran gets 503 saying why (long before the
    batch would have ended), the other models keep serving, and it is restarted."""
    repo = tmp_path / "repo"
    for name in ("simple", "mlp"):
        shutil.copytree(small_repo / name, repo / name)
    args: tuple[str, ...] = ("--instance-memory-limit-mb=100",)
    if limit_from == "config":
        args = ()
        with open(repo / "simple" / "config.pbtxt", "a") as f:
            f.write('parameters { key: "shoal_instance_memory_limit_mb" '
                    'value { string_value: "100" } }\n')  # fmt: skip
    srv = ShoalServer(repo, *args, env={"SHOAL_TEST_FAULT": "leak-in-batch:simple"})
    try:
        client = httpclient.InferenceServerClient(srv.url, network_timeout=60, concurrency=2)
        leaking = srv.worker_pid("simple")
        for model, limit in (("simple", 100), ("mlp", 100 if limit_from == "flag" else 0)):
            status, body = srv.http(f"/v2/shoal/models/{model}")
            assert status == 200, body
            (version,) = json.loads(body)["versions"]
            assert version["memory_limit_mb"] == limit
            (inst,) = version["instances"]
            assert 0 < inst["memory_mb"] < 100  # as the broker reads it: all is well
        labels = 'model="simple",version="1"'
        held = metric(srv, f'shoal_instance_memory_bytes{{instance="0",{labels}}}')
        assert 0 < held < 100 << 20
        assert metric(srv, f"shoal_instance_memory_limit_bytes{{{labels}}}") == 100 << 20
        t0 = time.monotonic()
        pending = client.async_infer("simple", simple_inputs())
        time.sleep(0.3)  # the batch is holding its memory now
        out = client.infer("mlp", mlp_input()).as_numpy("OUTPUT0")
        assert out is not None and out.shape == (1, 256)
        with pytest.raises(InferenceServerException) as e:
            pending.get_result()
        assert time.monotonic() - t0 < 10  # the batch alone would have taken 20 s
        assert e.value.status() == "503"
        assert re.search(
            rf"worker process \(pid {leaking}\) was killed \(it held \d+ MiB of memory, "
            r"over its limit of 100 MiB\)",
            str(e.value.message()),
        ), e.value.message()
        assert "is killed: it held" in srv.log()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if client.is_model_ready("simple") and srv.worker_pid("simple") != leaking:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"simple not restarted:\n{srv.log()}")
        srv.seen_pids |= set(srv.pids())
        exits = 'shoal_instance_exit_count{model="simple",reason="memory_limit",version="1"}'
        assert metric(srv, exits) == 1
        assert metric(srv, exits.replace("memory_limit", "crash")) == 0
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_an_instance_over_its_limit_is_stopped_after_its_batch_while_its_sibling_serves(
    small_repo: Path, tmp_path: Path
) -> None:
    """Instance 0 of simple leaks 256 MiB in each batch; instance 1 does not. Over its
    limit (500 MiB, after two batches) instance 0 gets no more batches and is stopped
    after the one it runs, so no request is lost: every request is answered, by instance
    1 (or by instance 0 restarted, until it leaks again). mlp's config of 0 frees it
    from the server's limit."""
    repo = tmp_path / "repo"
    for name in ("simple", "mlp"):
        shutil.copytree(small_repo / name, repo / name)
    with open(repo / "simple" / "config.pbtxt", "a") as f:
        f.write("instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    with open(repo / "mlp" / "config.pbtxt", "a") as f:
        f.write('parameters { key: "shoal_instance_memory_limit_mb" '
                'value { string_value: "0" } }\n')  # fmt: skip
    srv = ShoalServer(
        repo, "--instance-memory-limit-mb=500", env={"SHOAL_TEST_FAULT": "leak:simple#0"}
    )
    try:
        limits = {}
        for model in ("simple", "mlp"):
            _, body = srv.http(f"/v2/shoal/models/{model}")
            limits[model] = json.loads(body)["versions"][0]["memory_limit_mb"]
        assert limits == {"simple": 500, "mlp": 0}
        client = httpclient.InferenceServerClient(srv.url, network_timeout=30)
        labels = 'model="simple",reason="memory_limit",version="1"'
        deadline = time.monotonic() + 30
        answered = 0
        while time.monotonic() < deadline and (answered < 20 or metric(
            srv, f"shoal_instance_exit_count{{{labels}}}") < 1):  # fmt: skip
            out = client.infer("simple", simple_inputs()).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, np.full((1, 16), 2))
            answered += 1
            time.sleep(0.2)  # instance 0 runs at most one batch more before the check
        assert metric(srv, f"shoal_instance_exit_count{{{labels}}}") >= 1, srv.log()
        assert "is stopped after its batch: it held" in srv.log()  # not killed: 2x is not reached
        srv.seen_pids |= set(srv.pids())
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_a_busy_worker_lets_go_of_slabs_its_frontend_unlinked(tmp_path: Path) -> None:
    """A burst of large requests grows the frontend's pool; once they are answered it
    unlinks the growth slabs, and the worker that mapped them must unmap them even while
    a steady trickle of requests never leaves it idle (else /dev/shm stays full of
    deleted, unlisted pages)."""
    model = modelgen.identity_model("FP32", [-1], batch=True)
    config = identity_config("identity_fp32", "FP32", "[ -1 ]", 8)
    modelgen.write_model(tmp_path, "identity_fp32", model, config)
    srv = ShoalServer(tmp_path)
    stop = threading.Event()
    worker = srv.worker_pid("identity_fp32")
    try:
        (frontend,) = srv.pids("frontend")
        os.kill(worker, signal.SIGSTOP)  # the burst queues: the pool must grow
        big = np.ones((1, 15 * 2**20), dtype=np.float32)  # 60 MiB a request

        def burst() -> None:
            c = httpclient.InferenceServerClient(srv.url, network_timeout=120)
            inp = httpclient.InferInput("INPUT0", list(big.shape), "FP32")
            inp.set_data_from_numpy(big)
            out = httpclient.InferRequestedOutput("OUTPUT0")
            assert c.infer("identity_fp32", [inp], outputs=[out]).as_numpy("OUTPUT0").shape == (
                big.shape
            )

        def front_slabs() -> int:
            return len(list(SHM_DIR.glob(f"shoal-{frontend}-front-*")))

        callers = [threading.Thread(target=burst) for _ in range(5)]
        for t in callers:
            t.start()
        deadline = time.monotonic() + 60
        while front_slabs() < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert front_slabs() == 5  # the first slab holds one; a growth slab for each other

        def trickle() -> None:
            c = httpclient.InferenceServerClient(srv.url)
            inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            while not stop.is_set():
                c.infer("identity_fp32", [inp])
                time.sleep(0.02)

        # Queued behind the burst already: from here on the worker is never idle.
        threading.Thread(target=trickle, daemon=True).start()
        os.kill(worker, signal.SIGCONT)
        for t in callers:
            t.join(timeout=120)
        assert front_slabs() < 5  # past its 256 MiB to keep, the pool shrank back

        def deleted_mappings() -> list[str]:
            with open(f"/proc/{worker}/maps") as f:
                return [ln for ln in f if f"shoal-{frontend}-front-" in ln and "(deleted)" in ln]

        deadline = time.monotonic() + 20
        while deleted_mappings() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not deleted_mappings()
        assert not stop.is_set()  # the trickle ran throughout
    finally:
        stop.set()
        os.kill(worker, signal.SIGCONT)
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)
