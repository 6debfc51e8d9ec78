"""KV block accounting: ids, reference counts, a free queue and a prefix-cache index.

No tensors live here (STYLE.md habit 5): the executor maps block ids to rows of its KV tensor and
the simulator uses them as plain numbers, so fragmentation, prefix hits and preemptions are the
same on both backends.

Every block is in exactly one of three states:

    used          ref > 0                         (held by >= 1 request)
    free, plain   ref == 0, no hash               (in ``_plain``: a LIFO stack)
    free, cached  ref == 0, hash -> block in index (in ``_lru``: oldest first, evicted first)

Allocation takes plain blocks first and evicts the least recently freed cached block only when
no plain block is left, so cached prefixes survive as long as possible.

KV events (as production engines publish them to a cache-aware router): when ``events`` is a
list, every hash that enters the index appends ``(STORED, hash)`` and every evicted one
``(REMOVED, hash)``, in order; the pool's owner drains the list. ``None`` (default): none kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import chain

STORED, REMOVED = 1, 0  # kinds of KV event


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` tokens.

    Contracts:
        * ``num_free``/``match`` never modify the pool.
        * ``allocate(n)`` returns ``n`` fresh block ids with ref 1, or ``None`` and changes nothing.
        * ``adopt`` takes a reference on blocks found by ``match`` (reviving cached free blocks).
        * ``release`` drops one reference per id; a block reaching 0 becomes free (cached if it
          has a hash, plain otherwise). Releasing a block with ref 0 is an AssertionError.
        * ``release_drafts`` frees blocks that held only rejected draft tokens: each must be
          held once and never published (an AssertionError otherwise), so the prefix-cache
          index and its hash chains are untouched; they return to the plain free stack.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._index: dict[int, int] = {}  # block hash -> block id
        # Plain free blocks as a stack; reversed so that a fresh pool hands out 0, 1, 2, ...
        self._plain: list[int] = list(range(num_blocks - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.events: list[tuple[int, int]] | None = None  # KV events, see the module docstring

    # -- queries (no side effects) -------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (plain plus evictable cached)."""
        return len(self._plain) + len(self._lru)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._plain) - len(self._lru)

    @property
    def num_cached(self) -> int:
        return len(self._index)

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def hash_of(self, block: int) -> int | None:
        """The chained hash ``block`` is published under (None: not published)."""
        return self._hash[block]

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._index

    def match(self, hashes: Sequence[int]) -> list[int]:
        """Longest prefix of ``hashes`` present in the cache index, as block ids."""
        out = []
        index = self._index
        for h in hashes:
            b = index.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def num_matched(self, hashes: Sequence[int]) -> int:
        """``len(match(hashes))``, without building the list."""
        n, index = 0, self._index
        for h in hashes:
            if h not in index:
                break
            n += 1
        return n

    def num_free_after_adopting(self, blocks: Iterable[int]) -> int:
        """Free blocks left if ``blocks`` (from ``match``) were adopted."""
        return self.num_free - sum(1 for b in blocks if self._ref[b] == 0)

    # -- mutation ------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        if n > len(self._plain) + len(self._lru):
            return None
        plain = self._plain
        k = min(n, len(plain))
        out = plain[len(plain) - k :]
        del plain[len(plain) - k :]
        out.reverse()
        ref = self._ref
        for b in out:
            ref[b] = 1
        while len(out) < n:
            b, _ = self._lru.popitem(last=False)
            h = self._hash[b]
            assert h is not None
            del self._index[h]
            self._hash[b] = None
            ref[b] = 1
            out.append(b)
            if self.events is not None:
                self.events.append((REMOVED, h))
        return out

    def adopt(self, blocks: Iterable[int]) -> None:
        ref = self._ref
        for b in blocks:
            if ref[b] == 0:
                del self._lru[b]
            ref[b] += 1

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference per block; freed blocks enter the free queue tail-first.

        ``blocks`` is a request's table in order; it is walked backwards so that, among one
        request's cached blocks, the deepest (least shareable) is evicted first.
        """
        ref, hashes, plain, lru = self._ref, self._hash, self._plain, self._lru
        for b in reversed(blocks):
            r = ref[b] - 1
            assert r >= 0, f"double free of block {b}"
            ref[b] = r
            if r == 0:
                if hashes[b] is None:
                    plain.append(b)
                else:
                    lru[b] = None

    def release_drafts(self, blocks: Sequence[int]) -> None:
        """Free a table's tail blocks whose draft tokens were rejected (see the contract)."""
        ref, hashes, plain = self._ref, self._hash, self._plain
        for b in reversed(blocks):
            assert ref[b] == 1, f"draft block {b} is shared (ref {ref[b]})"
            assert hashes[b] is None, f"draft block {b} was published in the prefix cache"
            ref[b] = 0
            plain.append(b)

    def register(self, block: int, block_hash: int) -> bool:
        """Publish a full, used block under its chained hash. False if the hash is taken."""
        assert self._ref[block] > 0 and self._hash[block] is None
        if block_hash in self._index:
            return False
        self._index[block_hash] = block
        self._hash[block] = block_hash
        if self.events is not None:
            self.events.append((STORED, block_hash))
        return True

    def register_many(self, blocks: Sequence[int], hashes: Sequence[int]) -> None:
        """``register`` for each pair; taken hashes are skipped."""
        index, block_hash, ref, events = self._index, self._hash, self._ref, self.events
        for b, h in zip(blocks, hashes):
            assert ref[b] > 0 and block_hash[b] is None
            if h not in index:
                index[h] = b
                block_hash[b] = h
                if events is not None:
                    events.append((STORED, h))

    # -- invariants ----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Assert the three-state partition and the index's consistency."""
        # Counts and C-level scans, no set of every block id: a pool holds ~10^5 blocks.
        plain, lru, ref, hashes, index = self._plain, self._lru, self._ref, self._hash, self._index
        plain_set = set(plain)
        assert len(plain_set) == len(plain), "duplicate in plain free stack"
        assert plain_set.isdisjoint(lru), "block both plain-free and cached-free"
        assert min(ref) >= 0, "negative ref count"
        # the free blocks (ref 0) are the free lists': as many of them, and all of those at 0
        zeros = ref.count(0) == len(plain) + len(lru)
        assert zeros and not any(map(ref.__getitem__, chain(plain, lru))), (
            "free blocks differ from the free lists"
        )
        assert list(map(hashes.__getitem__, plain)).count(None) == len(plain), (
            "plain free block carries a hash"
        )
        assert None not in map(hashes.__getitem__, lru), "cached free block without a hash"
        hashed = len(hashes) - hashes.count(None)
        assert len(index) == hashed, "index size differs from hashed blocks"
        # with the sizes equal, this makes the index a bijection onto the hashed blocks
        assert list(map(hashes.__getitem__, index.values())) == list(index), (
            "index points to wrong block"
        )
