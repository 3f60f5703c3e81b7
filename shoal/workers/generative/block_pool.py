"""The KV-cache block pool of one model instance: which blocks are free, how many
sequences hold each one, and which full prompt blocks can be shared (pure: no torch).

A block holds ``block_size`` tokens' KV. A sequence holds its blocks through its block
table; a full block of prompt tokens whose KV is computed is registered under the hash
of every token up to its end, so that a later sequence with the same prompt prefix takes
it (its reference count goes up) instead of computing it again.

A block whose last holder lets go of it is free, but keeps its KV and its place in the
prefix table until it is handed out again: free blocks are handed out least recently
freed first, so a prompt prefix used a moment ago (a chat's system prompt) is still there
for the next request. Such a block counts as free: it is reused the moment a sequence
needs a fresh block and no other is left.

A sequence about to write into a block it shares (``needs_copy``) gets its own copy
first (``copy_on_write``): the caller copies the KV, then writes. One thread (the
engine's) uses it.
"""

from __future__ import annotations

from collections import OrderedDict

#: A full block's identity: the hash of its tokens and of every token before them.
PrefixHash = int


def block_hashes(tokens: list[int], block_size: int, count: int) -> list[PrefixHash]:
    """The prefix hashes of the first ``count`` full blocks of ``tokens``."""
    hashes: list[PrefixHash] = []
    parent = 0
    for i in range(count):
        parent = hash((parent, tuple(tokens[i * block_size : (i + 1) * block_size])))
        hashes.append(parent)
    return hashes


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("a KV-cache pool needs at least one block")
        self.num_blocks = num_blocks
        # free blocks, least recently freed first (a dict: in order, removable by key)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._refs = [0] * num_blocks
        self._by_hash: dict[PrefixHash, int] = {}
        self._hash_of: dict[int, PrefixHash] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def allocate(self, count: int) -> list[int] | None:
        """``count`` fresh blocks (one reference each; a cached prefix block handed out
        leaves the prefix table), or None (and none taken) when fewer are free."""
        if count > len(self._free):
            return None
        blocks = []
        for _ in range(count):
            b, _ = self._free.popitem(last=False)
            h = self._hash_of.pop(b, None)
            if h is not None and self._by_hash.get(h) == b:
                del self._by_hash[h]
            self._refs[b] = 1
            blocks.append(b)
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Let go of one reference to each block."""
        for b in blocks:
            if self._refs[b] <= 0:
                raise ValueError(f"block {b} is already free")
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None

    def share(self, hashes: list[PrefixHash]) -> list[int]:
        """The registered blocks of the longest prefix of ``hashes``, each with one more
        reference (the caller's); a free one among them is taken back from the free list."""
        found: list[int] = []
        for h in hashes:
            b = self._by_hash.get(h)
            if b is None:
                break
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1
            found.append(b)
        return found

    def register(self, block: int, h: PrefixHash) -> None:
        """``block`` (held) now holds the computed KV of the full prompt block ``h``; the
        first block registered under a hash stays the one shared."""
        if h not in self._by_hash and block not in self._hash_of:
            self._by_hash[h] = block
            self._hash_of[block] = h

    def needs_copy(self, block: int) -> bool:
        """Whether a holder must copy ``block`` before writing into it (others read it)."""
        return self._refs[block] > 1

    def copy_on_write(self, block: int) -> int | None:
        """A fresh block to hold a private copy of ``block`` (whose reference the caller
        gives up), or None when none is free (nothing changes)."""
        fresh = self.allocate(1)
        if fresh is None:
            return None
        self.free([block])
        return fresh[0]
