"""BYTES layout checks: Triton 2.51's answers to the same malformed buffers."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.ipc.bytes_tensors import unpack
from shoal.ipc.datatypes import BytesLayoutError, check_bytes_layout, serialize_bytes

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


def test_whole_elements_give_their_lengths() -> None:
    buf = serialize_bytes([b"ab", b"", b"c"])
    lengths = check_bytes_layout(buf, 3, "IN", "m")
    assert lengths.tolist() == [2, 0, 1]
    assert unpack(buf, lengths).tolist() == [b"ab", b"", b"c"]
    assert check_bytes_layout(memoryview(b"\x01\0\0\0x"), 1, "", "").tolist() == [1]
    assert check_bytes_layout(b"", 0, "IN", "m").tolist() == []


def _walk(buf: bytes, count: int) -> tuple[str, bool] | list[bytes]:
    """The element-by-element walk the vectorised check replaced: the reference."""
    what = "for inference input 'IN' for model 'm'"
    out: list[bytes] = []
    pos, end = 0, len(buf)
    short: tuple[int, int] | None = None
    while pos < end:
        if end - pos < 4:
            return (
                f"incomplete string length indicator {what}, expecting 4 bytes but only "
                f"{end - pos} bytes available. Please make sure the string length indicator "
                "is in one buffer.",
                True,
            )
        if len(out) >= count:
            return (
                f"unexpected number of string elements {len(out) + 1} {what}, expecting {count}",
                True,
            )
        (n,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        out.append(buf[pos : pos + n])
        if n > end - pos:
            short = (n, end - pos)
            break
        pos += n
    if len(out) != count:
        return f"expected {count} string elements {what}, got {len(out)}", True
    if short is not None:
        return (
            f"incomplete string data for inference input 'IN', expecting string of "
            f"length {short[0]} but only {short[1]} bytes available",
            False,
        )
    return out


#: Element lengths drawn mostly from a few values, so runs of equal lengths (which the
#: check takes with numpy) meet changes of length (which it walks).
_LENGTHS = st.lists(st.sampled_from([0, 1, 1, 1, 3, 7]) | st.integers(0, 40), max_size=300)


@settings(max_examples=300, deadline=None)
@given(
    lengths=_LENGTHS,
    cut=st.integers(0, 8),
    extra=st.binary(max_size=6),
    delta=st.integers(-2, 2),
)
def test_the_check_answers_as_the_walk(
    lengths: list[int], cut: int, extra: bytes, delta: int
) -> None:
    items = [bytes([65 + i % 26]) * n for i, n in enumerate(lengths)]
    buf = serialize_bytes(items)
    buf = buf[: len(buf) - cut] + extra if cut or extra else buf
    count = max(0, len(items) + delta)
    want = _walk(buf, count)
    try:
        got = check_bytes_layout(buf, count, "IN", "m")
    except BytesLayoutError as e:
        assert (e.message, e.names_request) == want
    else:
        assert unpack(buf, got).tolist() == want
