"""The KV-cache block pool with automatic prefix caching, after vLLM V1's ``BlockPool``.

- The pool has ``num_blocks`` blocks of ``block_size`` tokens. A request holds
  ``ceil(computed_tokens / block_size)`` blocks; a block's ``ref_cnt`` counts the requests that
  hold it (shared prefix blocks are held by several).
- Block hashes are chained over token ids: ``h_0 = H(ROOT, t_0..t_15)``,
  ``h_i = H(h_{i-1}, t_16i..t_16i+15)``, so a hash names a block *and its whole prefix*. ``H`` is
  Python's hash of a tuple of ints, which is deterministic across processes (only ``str`` and
  ``bytes`` hashing is salted). Only full blocks are hashed and cached.
- Freed blocks go to the tail of a free queue in reverse order (a request's last block first),
  and allocation takes from the head: the least recently freed block, and of one request its
  tail block, is evicted first (``evictions`` counts cached blocks lost this way). A free block
  keeps its hash until evicted, so a later request whose prefix matches takes it back out of the
  queue ("touch") instead of recomputing it.
- Capacity can be reduced at run time (the reduced-KV fault): ``capacity <= num_blocks`` blocks
  may be in use at once; usage = used / capacity, as ``vllm:kv_cache_usage_perc`` reports it.
- ``reset_prefix_cache`` forgets every hash, and is refused while any block is in use (vLLM
  refuses it likewise: a running request's blocks cannot be dropped).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

ROOT_HASH = 0x5EED_CAFE_F00D


def chain_hash(parent: int, tokens: Sequence[int]) -> int:
    """Hash of one full block given its parent block's hash."""
    return hash((parent, *tokens))


class BlockPool:
    """Blocks, their reference counts, the hash -> block map and the LRU free queue."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("a block pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.capacity = num_blocks
        self.num_used = 0
        self.evictions = 0
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        # OrderedDict gives O(1) removal from the middle when a cached free block is touched.
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    # -- capacity ---------------------------------------------------------------------------

    def set_capacity_fraction(self, fraction: float) -> None:
        """Let only ``fraction`` of the blocks be in use at once (at least one block)."""
        if not 0 < fraction <= 1:
            raise ValueError("fraction must be in (0, 1]")
        self.capacity = max(1, int(self.num_blocks * fraction))

    def can_allocate(self, n: int) -> bool:
        return n <= self.capacity - self.num_used

    @property
    def usage(self) -> float:
        return min(1.0, self.num_used / self.capacity)

    # -- allocation -------------------------------------------------------------------------

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, evicting their cached hashes."""
        if n > self.capacity - self.num_used:
            raise RuntimeError(f"allocate({n}) with {self.capacity - self.num_used} usable blocks")
        out = []
        free, cached, block_hash, ref_cnt = self.free, self.cached, self.block_hash, self.ref_cnt
        for _ in range(n):
            b, _ = free.popitem(last=False)
            h = block_hash[b]
            if h is not None:
                del cached[h]
                block_hash[b] = None
                self.evictions += 1
            ref_cnt[b] = 1
            out.append(b)
        self.num_used += n
        return out

    def count_free_among(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the free queue (touching them uses capacity)."""
        ref_cnt = self.ref_cnt
        return sum(1 for b in blocks if ref_cnt[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cache-hit blocks, pulling free ones out of the queue."""
        ref_cnt, free = self.ref_cnt, self.free
        for b in blocks:
            if ref_cnt[b] == 0:
                del free[b]
                self.num_used += 1
            ref_cnt[b] += 1

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block; blocks reaching zero join the queue tail."""
        ref_cnt, free = self.ref_cnt, self.free
        for b in reversed(blocks):
            ref_cnt[b] -= 1
            if ref_cnt[b] == 0:
                free[b] = None
                self.num_used -= 1

    # -- prefix cache -----------------------------------------------------------------------

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Blocks of the longest cached prefix of ``hashes``."""
        if not self.enable_caching:
            return []
        out = []
        cached = self.cached
        for h in hashes:
            b = cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def cache_block(self, block: int, h: int) -> None:
        """Publish a just-filled block under its chained hash (first writer wins)."""
        if self.enable_caching and h not in self.cached:
            self.cached[h] = block
            self.block_hash[block] = h

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use."""
        if self.num_used > 0:
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        return True

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)
