"""The frontend's response cache: what makes two requests the same, and what it keeps."""

from __future__ import annotations

import pytest

from shoal.configs.flags.frontend import cache_bytes
from shoal.dataplane.response_cache import ResponseCache
from shoal.dataplane.types import ClientRequest, InputTensor, OutputTensor, RequestedOutput


def _req(
    data: bytes = b"\x01\x00\x00\x00" * 4,
    shape: tuple[int, ...] = (1, 4),
    datatype: str = "INT32",
    outputs: tuple[RequestedOutput, ...] = (),
    more: tuple[InputTensor, ...] = (),
) -> ClientRequest:
    first = InputTensor("INPUT0", datatype, list(shape), memoryview(data))
    return ClientRequest("m", "", inputs=[first, *more], outputs=list(outputs))


def test_the_key_is_what_decides_the_answer() -> None:
    key = ResponseCache.key
    base = key(_req(), "m", 1)
    assert base is not None and base == key(_req(), "m", 1)
    other = InputTensor("INPUT1", "INT32", [1, 1], memoryview(b"\x00" * 4))
    # the order the client lists its inputs in does not matter
    swapped = ClientRequest("m", "", inputs=[other, *_req().inputs])
    assert key(_req(more=(other,)), "m", 1) == key(swapped, "m", 1)
    different = [
        key(_req(), "n", 1),
        key(_req(), "m", 2),
        key(_req(data=b"\x02\x00\x00\x00" * 4), "m", 1),
        key(_req(shape=(4, 1)), "m", 1),
        key(_req(datatype="FP32"), "m", 1),
        key(_req(more=(other,)), "m", 1),
        key(_req(outputs=(RequestedOutput("OUTPUT0"),)), "m", 1),
        key(_req(outputs=(RequestedOutput("OUTPUT1"),)), "m", 1),
        key(_req(outputs=(RequestedOutput("OUTPUT0", {"classification": 2}),)), "m", 1),
    ]
    assert len({base, *different}) == 1 + len(different)


def test_a_request_in_client_shared_memory_is_not_cached() -> None:
    in_shm = ClientRequest("m", "", inputs=[InputTensor("INPUT0", "INT32", [1, 4], None)])
    assert ResponseCache.key(in_shm, "m", 1) is None
    to_shm = _req(outputs=(RequestedOutput("OUTPUT0", {"shared_memory_region": "r"}),))
    assert ResponseCache.key(to_shm, "m", 1) is None


def _out(n: int, fill: bytes = b"x") -> list[OutputTensor]:
    return [OutputTensor("OUTPUT0", "UINT8", [1, n], memoryview(bytearray(fill * n)))]


def test_it_keeps_a_copy_and_drops_the_least_recently_used_when_full() -> None:
    entry = 256 + 128 + 100  # an entry's overhead, its one tensor's, and its bytes
    cache = ResponseCache(capacity=3 * entry)
    source = _out(100)
    assert cache.put(b"a", source)
    assert source[0].data is not None
    source[0].data[0] = ord("y")  # the slot is reused: the cache kept its own copy
    got = cache.get(b"a")
    assert got is not None and bytes(got[0].data or b"")[:2] == b"xx"
    assert got[0].shape == [1, 100] and got[0].datatype == "UINT8"
    assert cache.put(b"b", _out(100)) and cache.put(b"c", _out(100))
    assert cache.get(b"a") is not None  # a is now the most recently used
    assert cache.put(b"d", _out(100))  # b goes
    assert cache.get(b"b") is None
    assert all(cache.get(k) is not None for k in (b"a", b"c", b"d"))
    assert (len(cache), cache.used) == (3, 3 * entry)
    assert not cache.put(b"e", _out(3 * entry))  # larger than the whole cache: not kept
    assert len(cache) == 3
    assert (cache.hits, cache.misses) == (5, 1)
    cache.clear()
    assert (len(cache), cache.used) == (0, 0)


def test_huge_dimensions_and_top_k_make_keys_not_errors() -> None:
    """HTTP takes dimensions and a classification's K up to 2**64 - 1."""
    huge = 2**64 - 1
    empty = _req(data=b"", shape=(0, huge))
    top = _req(outputs=(RequestedOutput("OUTPUT0", {"classification": huge}),))
    keys = {ResponseCache.key(r, "m", 1) for r in (empty, top, _req())}
    assert None not in keys and len(keys) == 3


def test_the_cache_size_comes_from_tritonservers_flags() -> None:
    assert cache_bytes([], None) == 0
    assert cache_bytes(["local,size=1048576"], None) == 1048576
    assert cache_bytes([], "4096") == 4096  # --response-cache-byte-size, deprecated
    for flags, byte_size, words in (
        (["local,size=1"], "1", "Incompatible flags --response-cache-byte-size and"),
        ([",size=1"], None, "No cache specified. --cache-config option format is"),
        (["local"], None, "--cache-config option format is '<cache name>,<setting>=<value>'"),
        (["redis,host=x"], None, "shoal has the local cache only, not 'redis'"),
        (["local,max=1"], None, "the local cache has no setting 'max'"),
        (["local,size=1k"], None, "size must be a number of bytes, got '1k'"),
    ):
        with pytest.raises(ValueError) as e:
            cache_bytes(flags, byte_size)
        assert words in str(e.value)
