"""A frontend that hangs without exiting (SIGSTOP here; an event loop blocked for ever, in
life) keeps its ports, and the connections it accepted wait on it. The broker kills it
once it has sent nothing for --frontend-silence-timeout-secs (3 s here), shoal serve
starts another on the same ports, and meanwhile the other frontend serves on.

Which frontend a client's connection landed on (the two share each port) is read from
/proc: the test holds a connection on each, over HTTP and gRPC, before the stop."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, served_by, shm_segments_of
from tools import modelgen

SILENCE_S = 3
PROTOCOLS = ("http", "grpc")


def _inputs(protocol: str) -> list[Any]:
    module = httpclient if protocol == "http" else grpcclient
    ins = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return ins


def _infer(client: Any, protocol: str) -> None:
    out = client.infer("simple", _inputs(protocol)).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, np.full((1, 16), 2))


def _client_on(srv: ShoalServer, protocol: str, frontend: int) -> Any:
    """A client whose connection (made by one call) the frontend ``frontend`` serves:
    new clients are made until one lands there."""
    url, module = srv.client(protocol)
    port = srv.http_port if protocol == "http" else srv.grpc_port
    frontends = srv.pids("frontend")
    for _ in range(200):
        before = served_by(port, frontends)
        if protocol == "http":
            client = module.InferenceServerClient(url, network_timeout=120)
        else:  # its own connection: by default channels to one address share theirs
            client = module.InferenceServerClient(
                url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
            )
        assert client.is_server_live()
        landed = {c: pid for c, pid in served_by(port, frontends).items() if c not in before}
        assert len(landed) == 1, landed
        if frontend in landed.values():
            return client
        client.close()
    pytest.fail(f"no {protocol} connection landed on frontend {frontend} in 200 tries")


class OnTheStopped(threading.Thread):
    """A request sent over a connection the stopped frontend holds: what it got, once it
    returned. (Its own thread: a tritonclient HTTP client stays on the thread it was
    made on.)"""

    def __init__(self, srv: ShoalServer, protocol: str, frontend: int) -> None:
        super().__init__(daemon=True)
        self.srv, self.protocol, self.frontend = srv, protocol, frontend
        self.connected, self.go = threading.Event(), threading.Event()
        self.outcome = ""
        self.took = 0.0

    def run(self) -> None:
        client = _client_on(self.srv, self.protocol, self.frontend)
        self.connected.set()
        self.go.wait()
        start = time.monotonic()
        try:
            _infer(client, self.protocol)
            self.outcome = "answered"
        except InferenceServerException as e:
            self.outcome = f"{e.status()}: {e.message()}"
        except Exception as e:  # the connection the killed frontend held, reset
            self.outcome = f"{type(e).__name__}: {e}"
        self.took = time.monotonic() - start
        with contextlib.suppress(Exception):
            client.close()


def test_a_stuck_frontend_is_killed_and_replaced_on_the_same_ports(tmp_path: Path) -> None:
    modelgen.write_shipped_repository(tmp_path, ("simple",))
    srv = ShoalServer(
        tmp_path, "--frontend-processes=2", f"--frontend-silence-timeout-secs={SILENCE_S}"
    )
    victim, survivor = srv.pids("frontend")
    srv.seen_pids |= {victim, survivor}
    try:
        waiting = [OnTheStopped(srv, p, victim) for p in PROTOCOLS]
        for t in waiting:
            t.start()
        for t in waiting:
            assert t.connected.wait(120), "no connection to the frontend to stop"
        on_survivor = {p: _client_on(srv, p, survivor) for p in PROTOCOLS}
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        for t in waiting:
            t.go.set()
        # The other frontend serves throughout, over the connections it held.
        served = dict.fromkeys(PROTOCOLS, 0)
        while victim in srv.pids("frontend"):
            assert time.monotonic() < stopped_at + 60, f"never killed:\n{srv.log()}"
            for p in PROTOCOLS:
                _infer(on_survivor[p], p)
                served[p] += 1
        killed_after = time.monotonic() - stopped_at
        assert all(served.values()), served
        # What was sent to the stopped one came back (an error, or an answer from a
        # client that sent again on a new connection) rather than waiting for ever.
        for t in waiting:
            t.join(60)
            assert not t.is_alive(), f"a {t.protocol} request to the stopped one never returned"
        # Another frontend takes the stopped one's place; the survivor was never touched.
        deadline = stopped_at + 60
        while len(srv.pids("frontend")) != 2 or srv.http_status("/v2/health/ready") != 200:
            assert time.monotonic() < deadline, f"not replaced:\n{srv.log()}"
            time.sleep(0.05)
        (replacement,) = set(srv.pids("frontend")) - {survivor}
        srv.seen_pids.add(replacement)
        assert survivor in srv.pids("frontend") and replacement != victim
        # ...on the same ports: fresh connections land on it, and it answers.
        for p in PROTOCOLS:
            _infer(_client_on(srv, p, replacement), p)
        replaced_after = time.monotonic() - stopped_at
        for p in PROTOCOLS:
            _infer(on_survivor[p], p)  # the survivor's connections still serve
        assert not shm_segments_of({victim})  # its slab went with it
        log = srv.log()
        assert f"(pid {victim}) sent nothing for {SILENCE_S}s: stuck; killing it" in log, log
        assert "was killed by SIGKILL; restarting in 0.5s" in log, log
        print(
            f"\nstuck frontend (SIGSTOP, --frontend-silence-timeout-secs={SILENCE_S}): "
            f"killed {killed_after:.2f}s after the stop, replaced and serving on the same "
            f"ports {replaced_after:.2f}s after it; the other frontend served "
            f"{served['http']} HTTP + {served['grpc']} gRPC requests meanwhile; the requests "
            "sent to the stopped one: "
            + "; ".join(f"{t.protocol} {t.outcome!r} after {t.took:.2f}s" for t in waiting)
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_a_frontend_stuck_when_the_broker_restarts_is_killed_by_the_next_broker(
    tmp_path: Path,
) -> None:
    """A frontend stuck before the broker died never greets the next one: the next broker
    finds it running (by its result socket in the runtime directory) and judges it from
    its own start, as any frontend it knows."""
    modelgen.write_shipped_repository(tmp_path, ("simple",))
    srv = ShoalServer(tmp_path, f"--frontend-silence-timeout-secs={SILENCE_S}")
    (frontend,), (broker,) = srv.pids("frontend"), srv.pids("broker")
    srv.seen_pids |= {frontend, broker}
    try:
        os.kill(frontend, signal.SIGSTOP)
        os.kill(broker, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while frontend in srv.pids("frontend") or srv.http_status("/v2/health/ready") != 200:
            assert time.monotonic() < deadline, f"not replaced:\n{srv.log()}"
            time.sleep(0.05)
        (next_broker,) = srv.pids("broker")
        assert next_broker != broker
        killed = (
            f"broker[{next_broker}] E shoal.broker: frontend b'f-0-{frontend}' (pid {frontend}) "
            f"sent nothing for {SILENCE_S}s: stuck; killing it"
        )
        assert killed in srv.log(), srv.log()
        client = httpclient.InferenceServerClient(srv.url)
        _infer(client, "http")
        client.close()
        srv.seen_pids |= set(srv.pids())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(frontend, signal.SIGCONT)
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)
