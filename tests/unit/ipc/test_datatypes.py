"""BYTES layout checks: Triton 2.51's answers to the same malformed buffers."""

from __future__ import annotations

import struct

import pytest

from ipc.datatypes import BytesLayoutError, check_bytes_layout, serialize_bytes

WHAT = "for inference input 'IN' for model 'm'"


def _len(n: int) -> bytes:
    return struct.pack("<I", n)


@pytest.mark.parametrize(
    ("buf", "count", "message", "names_request"),
    [
        # what triton-peer (Triton 2.51) answered to each buffer, sent binary or from shm
        (
            _len(100) + b"ab" + serialize_bytes([b"c"]),
            2,
            f"expected 2 string elements {WHAT}, got 1",
            True,
        ),
        (
            serialize_bytes([b"ab"]) + _len(100) + b"c",
            2,
            "incomplete string data for inference input 'IN', expecting string of length "
            "100 but only 1 bytes available",
            False,
        ),
        (
            _len(100) + b"ab",
            1,
            "incomplete string data for inference input 'IN', expecting string of length "
            "100 but only 2 bytes available",
            False,
        ),
        (
            serialize_bytes([b"ab"]) + b"\x01\x00",
            2,
            f"incomplete string length indicator {WHAT}, expecting 4 bytes but only 2 bytes "
            "available. Please make sure the string length indicator is in one buffer.",
            True,
        ),
        (
            # a whole count, then 2 bytes: the cut prefix is reported before the surplus
            serialize_bytes([b"a"]) + b"\x01\x00",
            1,
            f"incomplete string length indicator {WHAT}, expecting 4 bytes but only 2 bytes "
            "available. Please make sure the string length indicator is in one buffer.",
            True,
        ),
        (serialize_bytes([b"ab"]), 2, f"expected 2 string elements {WHAT}, got 1", True),
        (b"", 2, f"expected 2 string elements {WHAT}, got 0", True),
        (
            serialize_bytes([b"a", b"b", b"c", b"d"]),
            2,
            f"unexpected number of string elements 3 {WHAT}, expecting 2",
            True,
        ),
    ],
)
def test_malformed_buffers_get_triton_s_message(
    buf: bytes, count: int, message: str, names_request: bool
) -> None:
    with pytest.raises(BytesLayoutError) as e:
        check_bytes_layout(buf, count, "IN", "m")
    assert e.value.message == message
    assert e.value.names_request is names_request


def test_whole_elements_pass_as_views() -> None:
    views = check_bytes_layout(serialize_bytes([b"ab", b"", b"c"]), 3, "IN", "m")
    assert [bytes(v) for v in views] == [b"ab", b"", b"c"]
    assert [bytes(v) for v in check_bytes_layout(memoryview(b"\x01\0\0\0x"), 1, "", "")] == [b"x"]
    assert check_bytes_layout(b"", 0, "IN", "m") == []
