"""The readiness socket's contract between a frontend and a worker whose model checks
its own readiness (shoal/workers/readiness.py answers, shoal/dataplane/readiness_checks.py
asks): the frontend connects to ``sockets.readiness_path``, writes one byte, and reads
the answer, ``1`` (ready) or ``0`` then why not, until the worker closes."""

from __future__ import annotations

#: How long the worker waits for the model's check (Triton's kUserModelReadinessTimeoutMs).
CHECK_TIMEOUT_S = 5.0

Answer = tuple[bool, str]  # (ready, why not)


def encode(answer: Answer) -> bytes:
    return (b"1" if answer[0] else b"0") + answer[1].encode(errors="replace")


def decode(data: bytes) -> Answer:
    """An answer as ``encode`` wrote it (anything else: not ready)."""
    if data[:1] == b"1":
        return True, ""
    return False, data[1:].decode(errors="replace") if data[:1] == b"0" else "no answer"
