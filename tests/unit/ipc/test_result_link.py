"""The workers' links to a frontend: answers arrive whole and in order however the stream
cuts them, a slow reader never blocks the sender, and a stuck or gone one is given up."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from shoal.ipc.result_link import FrameReader, ResultSender, frame, listen


def _connected(tmp_path: Path, stall_s: float = 30.0) -> tuple[ResultSender, socket.socket]:
    listener = listen(str(tmp_path / "results-f-0-1.sock"))
    sender = ResultSender(listener.getsockname(), stall_s=stall_s)
    conn, _ = listener.accept()
    listener.close()
    return sender, conn


def _read_all(conn: socket.socket, count: int, timeout: float = 10.0) -> list[bytes]:
    reader, out = FrameReader(), []
    conn.settimeout(timeout)
    while len(out) < count:
        data = conn.recv(65536)
        assert data, "the link ended early"
        out += [bytes(p) for p in reader.feed(data)]
    assert reader.partial == 0
    return out


def test_answers_cut_anywhere_come_out_whole_and_in_order() -> None:
    payloads = [b"", b"a", b"bc" * 100, bytes(range(256)) * 50]
    stream = b"".join(frame(payloads))
    for cut in (1, 3, 4, 5, 7, 64, 1000):
        reader, out = FrameReader(), []
        for at in range(0, len(stream), cut):
            out += [bytes(p) for p in reader.feed(stream[at : at + cut])]
        assert out == payloads, cut
        assert reader.partial == 0


def test_a_partial_answer_is_held_until_it_completes() -> None:
    reader = FrameReader()
    first, second = frame([b"hello"]), frame([b"world"])
    assert reader.feed(first[0] + first[1][:2]) == []
    assert reader.partial == 6
    out = reader.feed(first[1][2:] + second[0])
    assert [bytes(p) for p in out] == [b"hello"]
    assert [bytes(p) for p in reader.feed(second[1])] == [b"world"]


def test_a_batch_leaves_in_one_write_and_arrives_in_order(tmp_path: Path) -> None:
    sender, conn = _connected(tmp_path)
    try:
        batch = [f"answer {i}".encode() for i in range(40)]
        assert sender.send(batch)
        assert _read_all(conn, 40) == batch
    finally:
        sender.close()
        conn.close()


def test_a_reader_slower_than_the_sender_never_blocks_it(tmp_path: Path) -> None:
    """More than the socket holds: send returns at once, the rest follows in order as
    the frontend reads (a large answer, or a frontend busy for a while)."""
    sender, conn = _connected(tmp_path)
    try:
        big = [bytes([i]) * (1 << 20) for i in range(8)]  # 8 MiB, far over a socket's buffer
        started = time.monotonic()
        for p in big:
            assert sender.send([p])
        assert sender.send([b"last"])  # queued behind, not overtaking
        assert time.monotonic() - started < 1.0  # nothing was read yet: it did not wait
        assert _read_all(conn, 9) == [*big, b"last"]
    finally:
        sender.close()
        conn.close()


def test_a_frontend_that_reads_nothing_is_given_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sender, conn = _connected(tmp_path, stall_s=0.3)
    try:
        with caplog.at_level(logging.ERROR, logger="shoal.ipc.results"):
            assert sender.send([b"\0" * (4 << 20)])  # waits on a reader that never reads
            deadline = time.monotonic() + 10
            while not sender.closed and time.monotonic() < deadline:
                time.sleep(0.05)
        assert sender.closed
        assert "read nothing for" in caplog.text
        assert not sender.send([b"more"])  # dropped: the caller says so
    finally:
        sender.close()
        conn.close()


def test_a_frontend_gone_closes_the_link(tmp_path: Path) -> None:
    sender, conn = _connected(tmp_path)
    conn.close()
    try:
        results = [sender.send([b"x" * 1000]) for _ in range(50)]
        assert results[-1] is False and sender.closed
    finally:
        sender.close()


def test_no_frontend_listening_is_an_error_at_once(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ResultSender(str(tmp_path / "results-f-0-2.sock"))


def test_senders_on_many_threads_never_interleave_answers(tmp_path: Path) -> None:
    sender, conn = _connected(tmp_path)
    per_thread, threads = 200, 4
    try:

        def send(t: int) -> None:
            for i in range(per_thread):
                assert sender.send([f"{t}:{i}".encode() * 50])

        workers = [threading.Thread(target=send, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        got = _read_all(conn, per_thread * threads)
        for w in workers:
            w.join()
        for t in range(threads):  # each thread's answers whole, and in its order
            mine = [p for p in got if p.startswith(f"{t}:".encode())]
            assert mine == [f"{t}:{i}".encode() * 50 for i in range(per_thread)]
    finally:
        sender.close()
        conn.close()
