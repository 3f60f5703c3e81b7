"""Triton's rate limiter (--rate-limit=execution_count) end to end, observed as Triton's
L0_rate_limiter observes it: resources that keep instances from running at once, batches
that grow while an instance waits for its turn, and the loads refused for resources
given too few copies. Workers are held with SIGSTOP, so what is busy and what waits is
known, not raced."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.repos import infer_identity, write_identity
from tests.serverctl import ShoalServer, served


def _limited(resources: str, count: int = 1, priority: int = 0) -> str:
    return (
        f"instance_group [ {{ count: {count} kind: KIND_CPU "
        f"rate_limiter {{ resources [ {resources} ] priority: {priority} }} }} ]\n"
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("rate-limit-repo")
    # a and b share the one copy of R: never running at once
    write_identity(repo, "a", _limited('{ name: "R" count: 1 }'))
    write_identity(repo, "b", _limited('{ name: "R" count: 1 }', priority=2))
    # two instances, resources for one: the second waits, and its batch grows meanwhile
    write_identity(
        repo,
        "grow",
        _limited('{ name: "G" global: true count: 1 }', count=2)
        + "dynamic_batching { preferred_batch_size: [ 1, 2, 3, 4 ] }",
    )
    write_identity(repo, "free", "instance_group [ { count: 1 kind: KIND_CPU } ]")
    # waits for R too, but only 0.3 s in its queue
    write_identity(
        repo,
        "impatient",
        _limited('{ name: "R" count: 1 }')
        + "dynamic_batching { default_queue_policy { timeout_action: REJECT "
        "default_timeout_microseconds: 300000 } }",
    )
    return repo


@pytest.fixture(scope="module")
def limited(repo: Path) -> Iterator[ShoalServer]:
    with served(repo, "--rate-limit=execution_count") as srv:
        yield srv


def _in_thread(url: str, model: str, value: float, answers: dict[float, float]) -> threading.Thread:
    def call() -> None:
        answers[value] = float(infer_identity(url, model, value)[0, 0])

    t = threading.Thread(target=call)
    t.start()
    return t


def _version(url: str, model: str) -> dict:
    with urllib.request.urlopen(f"http://{url}/v2/shoal/models/{model}", timeout=5) as r:
        return dict(json.loads(r.read())["versions"][0])


def _until(what: str, check: object) -> None:
    deadline = time.monotonic() + 30
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _busy(url: str, model: str) -> int:
    return sum(i["busy"] for i in _version(url, model)["instances"])


def _batch_sizes(url: str, model: str) -> dict[int, int]:
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=5) as r:
        (stats,) = json.loads(r.read())["model_stats"]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def _worker_pids(server: ShoalServer, model: str) -> list[int]:
    return [i["pid"] for i in _version(server.url, model)["instances"]]


@contextlib.contextmanager
def _a_holds_r(server: ShoalServer) -> Iterator[dict[float, float]]:
    """Within the block, a's one instance runs a request (1.0) with its worker stopped,
    so it holds R; after it, that request is answered. Yields the answers by value."""
    url = server.url
    (a_pid,) = _worker_pids(server, "a")
    answers: dict[float, float] = {}
    os.kill(a_pid, signal.SIGSTOP)
    try:
        holder = _in_thread(url, "a", 1.0, answers)
        _until("a busy", lambda: _busy(url, "a") == 1)
        yield answers
    finally:
        os.kill(a_pid, signal.SIGCONT)
    holder.join(30)
    assert answers[1.0] == 1.0


def test_instances_that_share_a_resource_never_run_at_once(limited: ShoalServer) -> None:
    url = limited.url
    with _a_holds_r(limited) as answers:
        second = _in_thread(url, "b", 2.0, answers)
        _until("b's request queued", lambda: _version(url, "b")["queued"] == 1)
        # A model that needs nothing is not held back ...
        assert float(infer_identity(url, "free", 3.0)[0, 0]) == 3.0
        time.sleep(0.3)
        # ... while b's idle instance waits for the R that a holds.
        assert _version(url, "b")["queued"] == 1 and _busy(url, "b") == 0
        assert answers == {}
        turns = {m: _version(url, m)["instances"][0]["rate_limiter"] for m in ("a", "b")}
        need_r = [{"name": "R", "count": 1, "device": 0}]
        assert turns["a"] == {
            "priority": 1,
            "resources": need_r,
            "executions": turns["a"]["executions"],
            "holding": True,
        }
        assert turns["b"] == {
            "priority": 2,
            "resources": need_r,
            "executions": turns["b"]["executions"],
            "holding": False,
        }
    second.join(30)
    assert answers == {1.0: 1.0, 2.0: 2.0}
    after = _version(url, "b")["instances"][0]["rate_limiter"]
    assert (after["executions"], after["holding"]) == (turns["b"]["executions"] + 1, False)


def test_a_request_held_back_for_its_resources_still_times_out(limited: ShoalServer) -> None:
    """Its queue timeout wakes the broker although its instance waits for a release: the
    request is refused in its time, not when the resource comes back."""
    url = limited.url
    with _a_holds_r(limited) as answers:
        with pytest.raises(InferenceServerException) as e:
            infer_identity(url, "impatient", 2.0)
        assert (e.value.status(), e.value.message()) == ("503", "Request timeout expired")
        # refused while a still holds R (stopped): not at a release, which never came
        assert _busy(url, "a") == 1 and answers == {}


def test_a_batch_grows_while_its_instance_waits_for_its_turn(limited: ShoalServer) -> None:
    """Triton's L0_rate_limiter dynamic batching case: every size is preferred, yet the
    requests that come while the resource is taken make one full batch."""
    url = limited.url
    pids = _worker_pids(limited, "grow")
    before = _batch_sizes(url, "grow")
    answers: dict[float, float] = {}
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        threads = [_in_thread(url, "grow", 0.0, answers)]
        _until("one instance busy", lambda: _busy(url, "grow") == 1)
        threads += [_in_thread(url, "grow", float(v), answers) for v in (1, 2, 3, 4)]
        _until("four queued", lambda: _version(url, "grow")["queued"] == 4)
        assert _busy(url, "grow") == 1  # the other instance is idle, and waits
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    for t in threads:
        t.join(30)
    assert answers == {v: v for v in (0.0, 1.0, 2.0, 3.0, 4.0)}
    after = _batch_sizes(url, "grow")
    grown = {size: after[size] - before.get(size, 0) for size in after}
    assert {size: n for size, n in grown.items() if n} == {1: 1, 4: 1}


def test_with_the_rate_limiter_off_its_configuration_changes_nothing(repo: Path) -> None:
    """Triton's default: instances run as soon as they are idle, whatever their groups'
    rate_limiter says."""
    with served(repo) as srv, _a_holds_r(srv):
        assert float(infer_identity(srv.url, "b", 2.0)[0, 0]) == 2.0  # R or not
        assert _version(srv.url, "b")["instances"][0]["rate_limiter"] is None


def test_a_model_given_too_few_copies_fails_its_load_and_gets_no_worker(tmp_path: Path) -> None:
    """Triton's L0_rate_limiter load failures, with its messages; the other models serve."""
    write_identity(tmp_path, "needs4", _limited('{ name: "resource1" count: 4 }'))
    write_identity(
        tmp_path,
        "needs2",
        _limited('{ name: "resource1" count: 2 }, { name: "resource2" global: true count: 2 }'),
    )
    # in name order after needs2, whose resource2 is global: the conflict is its own
    write_identity(tmp_path, "per_device", _limited('{ name: "resource2" count: 1 }'))
    with served(
        tmp_path,
        "--exit-on-error=false",
        "--strict-readiness=false",
        "--rate-limit=EXECUTION_COUNT",
        "--rate-limit-resource=resource1:3",
        "--rate-limit-resource=resource2:2",
    ) as srv:
        srv.wait_settled(("needs4", "needs2", "per_device"))
        assert _version(srv.url, "needs2")["state"] == "READY"
        assert float(infer_identity(srv.url, "needs2", 5.0)[0, 0]) == 5.0
        refused = {m: _version(srv.url, m) for m in ("needs4", "per_device")}
        assert {m: (v["state"], v["reason"]) for m, v in refused.items()} == {
            "needs4": (
                "UNAVAILABLE",
                'Invalid argument: Resource count for "resource1" is limited to 3 which will '
                "prevent scheduling of one or more model instances, the minimum required count "
                "is 4",
            ),
            "per_device": (
                "UNAVAILABLE",
                'Invalid argument: Resource "resource2" is present as both global and '
                "device-specific resource in the model configuration.",
            ),
        }
        assert all(v["instances"] == [] for v in refused.values())
        with pytest.raises(LookupError):
            srv.worker_pid("needs4")
        client = httpclient.InferenceServerClient(srv.url)
        index = {e["name"]: e for e in client.get_model_repository_index()}
        assert index["needs4"]["state"] == "UNAVAILABLE"
