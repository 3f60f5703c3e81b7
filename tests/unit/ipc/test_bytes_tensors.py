"""BYTES wire layout: numpy packing and unpacking against tritonclient's own codec."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from shoal.ipc import bytes_tensors

_ITEMS = st.lists(
    st.sampled_from([b"", b"a", b"\x00", b"ab\x00", b"\x00\x00x"]) | st.binary(max_size=30),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(items=_ITEMS)
def test_pack_and_unpack_agree_with_tritonclient(items: list[bytes]) -> None:
    packed = bytes_tensors.pack(items)
    want = serialize_byte_tensor(np.array(items, dtype=object)).item() if items else b""
    assert packed.tobytes() == want
    found = bytes_tensors.scan(packed.data, len(items))
    assert (found.end, found.cut, found.left) == (len(want), None, 0)
    got = bytes_tensors.unpack(packed.data, found.lengths)
    assert got.tolist() == items  # trailing NULs kept
    if items:
        assert got.tolist() == deserialize_bytes_tensor(want).tolist()


def test_pack_values_encodes_text_and_keeps_bytes() -> None:
    values = np.array(["é", b"x\x00", 3], dtype=object)
    assert bytes_tensors.pack_values(values).tobytes() == (
        b"\x02\0\0\0\xc3\xa9" + b"\x02\0\0\0x\x00" + b"\x01\0\0\x003"
    )


def test_a_million_one_byte_elements_round_trip() -> None:
    items = [b"A"] * 1_000_000 + [b"long element"] + [b"B"] * 1000
    packed = bytes_tensors.pack(items)
    found = bytes_tensors.scan(packed.data, len(items))
    assert found.lengths.size == len(items)
    assert bytes_tensors.unpack(packed.data, found.lengths).tolist() == items


def test_scan_stops_at_its_limit_and_reports_a_cut() -> None:
    packed = bytes_tensors.pack([b"a", b"b", b"c"]).tobytes()
    assert bytes_tensors.scan(packed, 2).lengths.tolist() == [1, 1]
    cut = bytes_tensors.scan(packed[:-1], 5)
    assert (cut.lengths.tolist(), cut.cut, cut.left) == ([1, 1], 1, 0)
    short = bytes_tensors.scan(packed + b"\x01\x00", 5)
    assert (short.lengths.size, short.cut, short.left) == (3, None, 2)
