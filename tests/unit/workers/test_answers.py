"""A worker answers each frontend once per batch: the answers of a batch's requests from
one frontend travel in one message, in the batch's order."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import zmq

from shoal.ipc import messages as m
from shoal.ipc import sockets
from shoal.ipc.result_link import FrameReader, listen
from shoal.workers.loading import WorkerSettings
from shoal.workers.proc import WorkerProc
from tests.repos import write_identity


def _item(frontend: bytes, req_id: int, value: float) -> m.WorkItem:
    data = np.full((1, 4), value, dtype=np.float32).tobytes()
    x = m.TensorRef("INPUT0", "FP32", [1, 4], len(data), data=data)
    return m.WorkItem(frontend, m.InferRequest(req_id, "ident", 1, [x], [m.OutputSpec("OUTPUT0")]))


def test_the_answers_of_a_batch_go_to_each_frontend_in_one_message(tmp_path: Path) -> None:
    repo, run = tmp_path / "repo", tmp_path / "run"
    run.mkdir(mode=0o700)
    write_identity(repo, "ident")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    broker = sockets.router(ctx, sockets.endpoint(run, sockets.WORKER_SOCKET))
    fe_a, fe_b = (f"f-{i}-{os.getpid()}".encode() for i in (0, 1))
    listeners = {fe: listen(sockets.result_path(run, fe)) for fe in (fe_a, fe_b)}
    worker = WorkerProc(WorkerSettings(repo, "ident", 1, 0, run))
    try:
        assert isinstance(worker.load(), m.WorkerReady)
        items = [_item(fe_a, 7, 1.0), _item(fe_b, 7, 2.0), _item(fe_a, 8, 3.0)]
        worker.execute(m.ExecuteBatch(1, items))
        assert broker.poll(2000)
        _, kind, payload = broker.recv_multipart()
        done = m.decode(kind, payload)
        assert isinstance(done, m.BatchDone)
        assert (done.batch_id, done.batch_size, done.failed) == (1, 3, [])

        def answers(fe: bytes) -> list[tuple[int, float]]:
            listeners[fe].settimeout(2)
            conn, _ = listeners[fe].accept()  # the worker's link to this frontend
            conn.settimeout(2)
            reader, out = FrameReader(), []
            data = conn.recv(1 << 20)  # one write for the batch
            for payload in reader.feed(data):
                resp = m.decode_response(payload)
                (ref,) = resp.outputs
                assert resp.error is None and ref.data is not None
                out.append((resp.req_id, float(np.frombuffer(ref.data, np.float32)[0])))
            assert reader.partial == 0
            conn.settimeout(0.1)
            with contextlib.suppress(TimeoutError):  # nothing else: silence, or the end
                assert conn.recv(1) == b""
            conn.close()
            return out

        assert answers(fe_a) == [(7, 1.0), (8, 3.0)]
        assert answers(fe_b) == [(7, 2.0)]
    finally:
        worker.close()
        broker.close(0)
        for listener in listeners.values():
            listener.close()
        ctx.term()
