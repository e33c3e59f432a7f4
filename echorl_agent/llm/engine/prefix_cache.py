"""Prefix cache over real KV blocks: chained block hashes, ref counts, LRU eviction, collision checks.

The KV of every sequence lives in fixed-size blocks of one pool (see :class:`echorl_agent.llm.engine.runner.ModelRunner`).
A *full* block is identified by the chained hash ``h_i = H(h_{i-1}, tokens of block i)`` (nano-vllm / vLLM
automatic prefix caching), so a hash names the whole prefix up to and including that block. A new request walks its
prompt block by block; every hit is re-checked against the stored token ids (a hash collision is counted and treated
as a miss, so a different prefix never receives stale KV). Matched blocks are shared (ref count + 1); the uncached
suffix gets fresh blocks. When a block's ref count drops to 0 it stays in the hash map, reusable, at the tail of an
LRU list; allocation takes never-hashed free blocks first and then evicts the least recently used cached block,
so the pool size is the token budget (``max_tokens`` or ``max_bytes`` in :class:`PrefixCacheConfig`).

Statistics: per request the cached and computed prompt tokens; overall the reuse rate
``rho = |KV_frozen| / |KV_total|`` (EchoRL Eq. 15) = cached prompt tokens / all prompt tokens.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PrefixCacheConfig", "PrefixCache", "CacheStats", "chained_block_hash"]


def chained_block_hash(prev_hash: int | None, tokens: Sequence[int]) -> int:
    """64-bit BLAKE2b hash of the previous block's hash and this block's token ids."""
    h = hashlib.blake2b(digest_size=8)
    h.update((prev_hash if prev_hash is not None else 0).to_bytes(8, "little", signed=False))
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")


@dataclass
class PrefixCacheConfig:
    """Size and behaviour of the prefix cache."""

    block_size: int = 16
    """Tokens per KV block (a power of two keeps the Triton kernel happy)."""
    max_tokens: int = 16384
    """KV budget in tokens (pool size = max_tokens // block_size blocks); ignored when max_bytes is set."""
    max_bytes: int | None = None
    """KV budget in bytes; the pool holds max_bytes // bytes_per_block blocks."""
    enable_prefix_caching: bool = True
    """False: never match cached blocks (every prompt token is recomputed) -- the 'cache off' baseline."""

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be > 0, got block_size={self.block_size}")
        if self.max_tokens < self.block_size:
            raise ValueError(
                f"max_tokens must be >= block_size, got max_tokens={self.max_tokens}, block_size={self.block_size}"
            )
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0 or None, got max_bytes={self.max_bytes}")

    def num_blocks(self, bytes_per_token: int) -> int:
        """Pool size in blocks for a model storing ``bytes_per_token`` of KV per token."""
        if self.max_bytes is not None:
            n = self.max_bytes // (bytes_per_token * self.block_size)
            if n < 1:
                raise ValueError(
                    f"max_bytes={self.max_bytes} holds no block of {self.block_size} tokens at "
                    f"{bytes_per_token} B/token; raise max_bytes"
                )
            return int(n)
        return self.max_tokens // self.block_size


@dataclass
class CacheStats:
    """Counters of the prefix cache (all monotone)."""

    num_requests: int = 0
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the cache (|KV_frozen|)."""
    num_computed_tokens: int = 0
    """Prompt tokens prefilled by the model."""
    num_evicted_blocks: int = 0
    num_hash_collisions: int = 0

    @property
    def reuse_rate(self) -> float:
        """rho = |KV_frozen| / |KV_total| over all prompts so far (EchoRL Eq. 15); 0 before any request."""
        total = self.num_cached_tokens + self.num_computed_tokens
        return self.num_cached_tokens / total if total else 0.0


@dataclass
class _Block:
    id: int
    ref_count: int = 0
    hash: int | None = None
    tokens: tuple[int, ...] = ()


@dataclass
class BlockAllocation:
    """Result of :meth:`PrefixCache.allocate`: the block table and how many prompt tokens were cached."""

    block_table: list[int]
    num_cached_tokens: int
    block_hashes: list[int] = field(default_factory=list)
    """Chained hashes of the leading full blocks already registered (continue the chain from the last)."""


class PrefixCache:
    """Block allocator with hash-based prefix sharing (see the module docstring).

    Args:
        num_blocks: pool size in blocks.
        config: block size and switches.
        hash_fn: chained hash (injectable so tests can force collisions).
    """

    def __init__(
        self,
        num_blocks: int,
        config: PrefixCacheConfig | None = None,
        hash_fn: Callable[[int | None, Sequence[int]], int] = chained_block_hash,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got num_blocks={num_blocks}")
        self.config = config or PrefixCacheConfig()
        self.block_size = self.config.block_size
        self.hash_fn = hash_fn
        self.blocks = [_Block(i) for i in range(num_blocks)]
        self._hash_to_block: dict[int, int] = {}
        self._free_plain: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives 0, 1, 2, ...
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU: first = least recently used
        self.stats = CacheStats()
        self.weight_version = 0
        """Version of the weights the cached KV was computed with (see :meth:`invalidate`)."""
        self._root: int | None = None  # chain seed of the first block: None at version 0, else the version
        self.generation = 0
        """Bumped by every :meth:`invalidate` and :meth:`reset` (the version alone may go back on a reset): what was
        computed under an older generation may be stale (:class:`~echorl_agent.llm.engine.score_memo.ScoreMemo`)."""

    def invalidate(self) -> int:
        """Make every cached block unreachable: the model's weights changed (after a learner update).

        The version seeds the hash chain of the first block, so a block registered under an older version can
        never match again (stale KV is never served); old blocks stay in the LRU list and are recycled as free
        blocks. Returns the new version.
        """
        self.weight_version += 1
        self.generation += 1
        self._root = self.weight_version
        return self.weight_version

    def reset(self, weight_version: int | None = None) -> None:
        """Forget every cached block (all blocks become never-hashed free blocks), optionally continuing at
        ``weight_version`` (a resumed training run goes on counting from its checkpoint's version).

        Since nothing stays registered, no KV of other weights is reachable whatever the version number, so the
        version may go back as well as forward.

        Raises:
            RuntimeError: a block is still referenced (a request is in flight).
        """
        busy = [b.id for b in self.blocks if b.ref_count]
        if busy:
            raise RuntimeError(f"reset with {len(busy)} blocks in use; wait for the requests to finish")
        for blk in self.blocks:
            blk.hash, blk.tokens = None, ()
        self._hash_to_block.clear()
        self._free_cached.clear()
        self._free_plain = list(range(self.num_blocks - 1, -1, -1))
        self.generation += 1
        if weight_version is not None:
            if isinstance(weight_version, bool) or not isinstance(weight_version, int) or weight_version < 0:
                raise ValueError(f"weight_version must be an int >= 0, got weight_version={weight_version!r}")
            self.weight_version = weight_version
            self._root = weight_version or None

    # ------------------------------------------------------------------ queries
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (never-hashed free + evictable cached)."""
        return len(self._free_plain) + len(self._free_cached)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a registered prefix (in use or evictable)."""
        return len(self._hash_to_block)

    def match(self, tokens: Sequence[int]) -> tuple[list[int], list[int]]:
        """Longest cached prefix of ``tokens`` in whole blocks: ``(block ids, their chained hashes)``.

        Does not change ref counts. Every hash hit is verified against the block's stored tokens.
        """
        ids: list[int] = []
        hashes: list[int] = []
        if not self.config.enable_prefix_caching:
            return ids, hashes
        bs = self.block_size
        prev: int | None = self._root
        for i in range(len(tokens) // bs):
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            h = self.hash_fn(prev, chunk)
            bid = self._hash_to_block.get(h)
            if bid is None:
                break
            if self.blocks[bid].tokens != chunk:
                self.stats.num_hash_collisions += 1
                break
            ids.append(bid)
            hashes.append(h)
            prev = h
        return ids, hashes

    def num_blocks_needed(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def can_allocate(self, tokens: Sequence[int]) -> bool:
        ids, _ = self.match(tokens)
        fresh = self.num_blocks_needed(len(tokens)) - len(ids)
        evictable_hits = sum(1 for b in ids if self.blocks[b].ref_count == 0)
        return fresh <= self.num_free_blocks - evictable_hits

    # ------------------------------------------------------------------ allocation
    def allocate(self, tokens: Sequence[int], record_stats: bool = True, use_cache: bool = True) -> BlockAllocation:
        """Blocks for a prompt: shared cached prefix blocks + fresh blocks for the rest.

        At least the last prompt token is always left uncached so the model produces its logits (if the whole
        prompt is cached, its last block is recomputed into a fresh block).

        Args:
            tokens: the prompt's token ids.
            record_stats: count the prompt in :attr:`stats` (cached vs computed tokens).
            use_cache: False skips matching (fresh blocks only), e.g. for the naive scoring baseline.

        Raises:
            MemoryError: the pool cannot hold the prompt (check :meth:`can_allocate` first).
        """
        ids, hashes = self.match(tokens) if use_cache else ([], [])
        if ids and len(ids) * self.block_size >= len(tokens):
            ids, hashes = ids[:-1], hashes[:-1]
        fresh = self.num_blocks_needed(len(tokens)) - len(ids)
        evictable_hits = sum(1 for b in ids if self.blocks[b].ref_count == 0)
        if fresh > self.num_free_blocks - evictable_hits:
            raise MemoryError(
                f"prefix cache full: need {fresh} blocks, {self.num_free_blocks - evictable_hits} free; "
                "raise PrefixCacheConfig.max_tokens or lower the batch size"
            )
        for b in ids:
            self._acquire(b)
        table = ids + [self._take_free() for _ in range(fresh)]
        cached = len(ids) * self.block_size
        if record_stats:
            self.stats.num_requests += 1
            self.stats.num_cached_tokens += cached
            self.stats.num_computed_tokens += len(tokens) - cached
        return BlockAllocation(table, cached, hashes)

    def share(self, block_ids: Sequence[int]) -> None:
        """Add a reference to blocks another sequence already holds (fork, e.g. scoring candidates)."""
        for b in block_ids:
            self._acquire(b)

    def append_block(self) -> int:
        """One fresh block for a growing sequence (decode crossing a block boundary)."""
        if self.num_free_blocks == 0:
            raise MemoryError("prefix cache full: no free block for a growing sequence")
        return self._take_free()

    def register(self, block_id: int, prev_hash: int | None, tokens: Sequence[int]) -> int:
        """Publish a just-filled block (its KV is written) under its chained hash; returns the hash.

        ``prev_hash`` is the hash of the previous block, or None for the first block of a sequence (the chain then
        starts from the current weight version's seed).

        If another block already holds the same prefix, the map keeps the existing block and this one stays
        private (it is freed normally on release).
        """
        chunk = tuple(tokens)
        if len(chunk) != self.block_size:
            raise ValueError(f"only full blocks are registered: got {len(chunk)} tokens, block_size={self.block_size}")
        h = self.hash_fn(self._root if prev_hash is None else prev_hash, chunk)
        if self.config.enable_prefix_caching and h not in self._hash_to_block:
            blk = self.blocks[block_id]
            blk.hash = h
            blk.tokens = chunk
            self._hash_to_block[h] = block_id
        return h

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop one reference to each block; unreferenced cached blocks become LRU-evictable."""
        for b in reversed(list(block_ids)):  # tail blocks first, so prefix blocks are evicted last
            blk = self.blocks[b]
            assert blk.ref_count > 0, f"block {b} released more often than acquired"
            blk.ref_count -= 1
            if blk.ref_count == 0:
                if blk.hash is not None:
                    self._free_cached[b] = None
                else:
                    self._free_plain.append(b)

    # ------------------------------------------------------------------ internals
    def _acquire(self, b: int) -> None:
        blk = self.blocks[b]
        if blk.ref_count == 0:
            self._free_cached.pop(b, None)
        blk.ref_count += 1

    def _take_free(self) -> int:
        if self._free_plain:
            b = self._free_plain.pop()
        else:
            b, _ = self._free_cached.popitem(last=False)  # evict the least recently used cached block
            blk = self.blocks[b]
            if blk.hash is not None and self._hash_to_block.get(blk.hash) == b:
                del self._hash_to_block[blk.hash]
            self.stats.num_evicted_blocks += 1
        blk = self.blocks[b]
        blk.hash = None
        blk.tokens = ()
        blk.ref_count = 1
        return b
