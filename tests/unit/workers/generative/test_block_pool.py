"""The KV-cache block pool: allocation, reference counts, prefix sharing, copy on write."""

from __future__ import annotations

import pytest

from shoal.workers.generative.block_pool import BlockPool, block_hashes


def test_allocation_is_all_or_nothing_and_free_returns_blocks() -> None:
    pool = BlockPool(4)
    a = pool.allocate(3)
    assert a is not None and len(set(a)) == 3 and pool.num_used == 3
    assert pool.allocate(2) is None and pool.num_free == 1  # nothing taken
    pool.free(a)
    assert pool.num_free == 4
    with pytest.raises(ValueError, match="already free"):
        pool.free([a[0]])


def test_identical_prompt_blocks_are_shared_and_stay_cached_once_free() -> None:
    pool = BlockPool(8)
    tokens = list(range(40))
    hashes = block_hashes(tokens, 16, 2)
    first = pool.allocate(3)
    assert first is not None
    pool.register(first[0], hashes[0])
    pool.register(first[1], hashes[1])
    shared = pool.share(block_hashes(tokens[:35], 16, 2))
    assert shared == first[:2] and pool.refs(first[0]) == 2 and pool.num_used == 3
    # a different second block shares only the first
    other = tokens[:16] + [99] * 16
    assert pool.share(block_hashes(other, 16, 2)) == first[:1]
    pool.free(first)
    pool.free(shared)
    pool.free(first[:1])
    assert pool.num_used == 0 and pool.num_free == 8
    # free, yet still in the prefix table: a later prompt takes them back
    assert pool.share(hashes) == first[:2] and pool.num_used == 2
    pool.free(first[:2])
    # handed out again (least recently freed first: the cached ones last), they leave it
    fresh = pool.allocate(8)
    assert fresh is not None and fresh[-2:] == first[:2]
    pool.free(fresh)
    assert pool.share(hashes) == []


def test_a_shared_block_is_copied_before_a_holder_writes_into_it() -> None:
    pool = BlockPool(3)
    (block,) = pool.allocate(1) or [0]
    pool.register(block, 7)
    assert pool.share([7]) == [block]
    assert pool.needs_copy(block)
    fresh = pool.copy_on_write(block)
    assert fresh is not None and fresh != block
    assert not pool.needs_copy(block) and pool.refs(fresh) == 1 and pool.num_used == 2


def test_copy_on_write_with_no_free_block_changes_nothing() -> None:
    pool = BlockPool(1)
    (block,) = pool.allocate(1) or [0]
    pool.register(block, 1)
    pool.share([1])
    assert pool.copy_on_write(block) is None and pool.refs(block) == 2
