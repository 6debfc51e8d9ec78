"""Per-request block tables on top of the ``BlockPool``, with prefix-cache hashing.

The scheduler is the only writer. Policies see a ``KVView`` (read-only). Invariant box for a
request ``r`` holding table ``T`` (``bs`` = block size):

    tokens  [0, bs) [bs, 2bs) ...  [(k-1)bs, C)      k = len(T) = ceil(C / bs)
    blocks   T[0]    T[1]     ...   T[k-1]
             |<- registered prompt blocks ->|        full blocks of the prompt, hashed, shareable

Only *prompt* blocks are hashed: generated tokens differ between backends (placeholders in the
simulator), so sharing stops at the prompt. A prefix hit never covers a request's last token
(docs/design.md), so every request computes at least one token and produces logits (a recompute
prefill keeps two, so that its counters still read as a prefill).

Speculative decoding (``horizon.speculation``): a verifying request's table grows, for one step,
past ``ceil(C / bs)`` by the blocks its draft tokens need (``allocate_drafts``: its *draft
tail*); ``trim`` then returns the blocks beyond its accepted tokens. A block is hashed only
from ``C``, the accepted tokens, so a draft never enters the prefix cache (and generated
tokens are never hashed at all); a draft tail is held once and unhashed, which
``check_integrity`` asserts.
"""

from __future__ import annotations

from collections.abc import Sequence

from horizon.block_pool import BlockPool
from horizon.request import Request, StepClock


def chained_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Hash of each full block, chained on its parent so equal hashes mean equal prefixes."""
    out: list[int] = []
    h = 0
    if not isinstance(token_ids, tuple):  # a tuple's slices are tuples: no copy per block
        token_ids = tuple(token_ids)
    for i in range(0, len(token_ids) - block_size + 1, block_size):
        h = hash((h, token_ids[i : i + block_size]))
        out.append(h)
    return out


class KVCacheManager:
    """Block tables of running requests; every method keeps the pool consistent or fails whole."""

    def __init__(self, pool: BlockPool, enable_prefix_caching: bool = True) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._tables: dict[int, list[int]] = {}
        self._registered: dict[int, int] = {}  # request id -> prompt blocks registered
        self._hashes: dict[int, list[int]] = {}  # request id -> prompt block hashes
        self._drafts: dict[int, int] = {}  # request id -> blocks of its draft tail (this step)
        self._held: list[int] = []  # this step's blocks of drafts drawn to be rejected

    # -- queries -------------------------------------------------------------------------------
    def blocks_of(self, req: Request) -> Sequence[int]:
        return self._tables.get(req.request_id, ())

    def num_blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        """Fresh blocks ``req`` needs to compute ``num_new_tokens`` more tokens."""
        held = len(self._tables.get(req.request_id, ()))
        need = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, need - held)

    def _prompt_hashes(self, req: Request) -> list[int]:
        hs = self._hashes.get(req.request_id)
        if hs is None:
            ids = req.prompt_token_ids
            hs = chained_block_hashes(ids, self.block_size) if ids is not None else []
            self._hashes[req.request_id] = hs
        return hs

    def seed_hashes(self, req: Request, hashes: list[int]) -> None:
        """Give ``req`` its prompt's chained block hashes, computed elsewhere (a router's view
        of this pool, same block size), so that they are not computed again."""
        self._hashes.setdefault(req.request_id, hashes)

    def prefix_hit(self, req: Request) -> list[int]:
        """Cached blocks ``req`` could adopt now (no side effects); never covers its last token."""
        if not self.enable_prefix_caching or req.prompt_token_ids is None:
            return []
        hit = self.pool.match(self._prompt_hashes(req))
        # A recompute (G >= 1) keeps two tokens to compute, else it would look like a decode
        # that never emitted (see the scheduler's ``_chunk``); so does a request to hand off
        # (its last prompt token is computed on the decode replica).
        keep = 2 if req.num_output_tokens or req.handoff else 1
        return hit[: (req.num_tokens - keep) // self.block_size]

    # -- mutation ------------------------------------------------------------------------------
    def adopt(self, req: Request, blocks: list[int]) -> None:
        """Start ``req``'s table with prefix-hit ``blocks`` (its table must be empty)."""
        assert req.request_id not in self._tables
        self.pool.adopt(blocks)
        self._tables[req.request_id] = list(blocks)
        self._registered[req.request_id] = len(blocks)

    def allocate(self, req: Request, num_blocks: int) -> bool:
        """Append ``num_blocks`` fresh blocks to ``req``'s table, or change nothing."""
        if num_blocks == 0:
            return True
        got = self.pool.allocate(num_blocks)
        if got is None:
            return False
        table = self._tables.get(req.request_id)
        if table is None:
            self._tables[req.request_id] = got
        else:
            table.extend(got)
        return True

    def append_one_each(self, reqs: Sequence[Request]) -> bool:
        """One fresh block for each running request in ``reqs``, or change nothing."""
        got = self.pool.allocate(len(reqs))
        if got is None:
            return False
        tables = self._tables
        for r, b in zip(reqs, got):
            tables[r.request_id].append(b)
        return True

    def allocate_drafts(self, req: Request, num_blocks: int) -> bool:
        """Append ``num_blocks`` fresh blocks for ``req``'s draft tokens this step (its draft
        tail, returned by ``trim``), or change nothing. ``req`` holds no draft tail yet."""
        assert req.request_id not in self._drafts, "a draft tail is already allocated"
        if not self.allocate(req, num_blocks):
            return False
        if num_blocks:
            self._drafts[req.request_id] = num_blocks
        return True

    def trim(self, req: Request) -> int:
        """After a verification: free ``req``'s blocks beyond its ``num_computed_tokens`` (the
        rejected drafts'); returns how many. They never were hashed (``register_computed``
        reads accepted tokens only) nor shared."""
        rid = req.request_id
        self._drafts.pop(rid, None)
        table = self._tables[rid]
        keep = -(-req.num_computed_tokens // self.block_size)
        extra = len(table) - keep
        if extra <= 0:
            return 0
        self.pool.release_drafts(table[keep:])
        del table[keep:]
        return extra

    @property
    def num_draft_tails(self) -> int:
        """Requests holding a draft tail, plus one if drafts' blocks are held (between a plan
        and its update)."""
        return len(self._drafts) + (1 if self._held else 0)

    def grow_each(self, grants: Sequence[tuple[Request, int]], total: int, held: int = 0) -> None:
        """``(request, n)``: append ``n`` fresh blocks to each running request's table (``total``
        in all), and hold ``held`` more (``hold_drafts``), taken in one allocation that must
        fit (the caller checked the free blocks)."""
        got = self.pool.allocate(total + held)
        assert got is not None, "grow_each without the free blocks"
        tables, i = self._tables, 0
        for r, n in grants:
            table = tables[r.request_id]
            if n == 1:
                table.append(got[i])
            else:
                table.extend(got[i : i + n])
            i += n
        if held:
            self._held.extend(got[total:])

    def hold_drafts(self, n: int) -> None:
        """Take ``n`` fresh blocks for this step's drafts that are drawn to be rejected (a
        scheduler that draws acceptance ahead): allocated with the step's other blocks, as
        their draft tails would be, and freed at its update (``release_held``) as ``trim``
        would free them; held here rather than in the requests' tables. Must fit."""
        got = self.pool.allocate(n)
        assert got is not None, "hold_drafts without the free blocks"
        self._held.extend(got)

    def release_held(self, n: int | None = None) -> None:
        """Free the last ``n`` held draft blocks (all if None), as rejected drafts' blocks."""
        held = self._held
        k = len(held) if n is None else n
        if k:
            self.pool.release_drafts(held[len(held) - k :])
            del held[len(held) - k :]

    def register_computed(self, req: Request) -> None:
        """Publish ``req``'s prompt blocks that are now fully computed."""
        if not self.enable_prefix_caching or req.prompt_token_ids is None:
            return
        rid = req.request_id
        done = min(req.num_computed_tokens, req.num_prompt_tokens) // self.block_size
        start = self._registered.get(rid, 0)
        if done <= start:
            return
        # a hash already taken keeps the older block (a duplicate prompt computed twice)
        self.pool.register_many(self._tables[rid][start:done], self._prompt_hashes(req)[start:done])
        self._registered[rid] = done

    def free(self, req: Request, keep_hashes: bool = False) -> int:
        """Release all of ``req``'s blocks; returns how many it held."""
        rid = req.request_id
        table = self._tables.pop(rid, None)
        self._registered.pop(rid, None)
        if self._drafts:
            self._drafts.pop(rid, None)
        if not keep_hashes:
            self._hashes.pop(rid, None)
        if table is None:
            return 0
        self.pool.release(table)
        return len(table)

    def check_integrity(self) -> None:
        """Pool invariants, and every used block's ref count equals the tables holding it."""
        self.pool.check_integrity()
        refs: dict[int, int] = {b: 1 for b in self._held}
        assert len(refs) == len(self._held), "a held draft block twice"
        for table in self._tables.values():
            assert len(set(table)) == len(table), "block twice in one table"
            for b in table:
                refs[b] = refs.get(b, 0) + 1
        # the pool's non-zero ref counts are exactly ``refs``: as many, and each equal (no
        # dict of a ~10^5-block pool; at a run's end the tables are empty)
        pool = self.pool
        ref, n = pool._ref, pool.num_blocks
        assert len(ref) - ref.count(0) == len(refs) and all(
            0 <= b < n and ref[b] == c for b, c in refs.items()
        ), "block ref counts differ from the tables holding them"
        for b in self._held:
            assert pool.hash_of(b) is None, f"held draft block {b} is hashed"
        for rid, n in self._drafts.items():
            tail = self._tables.get(rid)
            assert tail is not None and 0 < n <= len(tail), f"draft tail of {rid} not held"
            for b in tail[-n:]:
                assert pool.ref_count(b) == 1, f"draft block {b} of {rid} is shared"
                assert pool.hash_of(b) is None, f"draft block {b} of {rid} is hashed"


class KVView:
    """What a policy may read about the KV budget and who holds it. Nothing here mutates."""

    __slots__ = ("_kv", "_reserve", "_running", "_clock")

    def __init__(
        self,
        kv: KVCacheManager,
        reserve: ReservationLedger,
        running: dict[int, Request],
        clock: StepClock,
    ) -> None:
        self._kv = kv
        self._reserve = reserve
        self._running = running
        self._clock = clock

    @property
    def step(self) -> int:
        """Index of the step being planned."""
        return self._clock.step

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def running(self) -> tuple[Request, ...]:
        """Running requests in admission order (a snapshot; O(running) to build)."""
        return tuple(self._running.values())

    @property
    def block_size(self) -> int:
        return self._kv.block_size

    @property
    def num_blocks(self) -> int:
        return self._kv.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._kv.pool.num_free

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks running requests' reservations may still claim (0 without reservations)."""
        return self._reserve.outstanding

    def blocks_held(self, req: Request) -> int:
        return len(self._kv.blocks_of(req))

    @property
    def prefix_caching(self) -> bool:
        """Whether an admitted request may adopt cached prompt blocks."""
        return self._kv.enable_prefix_caching

    def cached_prefix_tokens(self, req: Request) -> int:
        """Prompt tokens of ``req`` the pool holds cached now: what admitting it now would not
        compute (whole blocks, never its last token; 0 without prefix caching). Changes nothing
        in the pool or any block table."""
        return len(self._kv.prefix_hit(req)) * self._kv.block_size

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        return self._kv.num_blocks_needed(req, num_new_tokens)

    def blocks_to_admit(self, req: Request, total_tokens: int) -> int:
        """Free blocks that admitting ``req`` and growing it to ``total_tokens`` would consume,
        after prefix-cache hits (a cached free block revived by the hit counts as consumed)."""
        hit = self._kv.prefix_hit(req)
        fresh = max(0, -(-total_tokens // self._kv.block_size) - len(hit))
        revived = self._kv.pool.num_free - self._kv.pool.num_free_after_adopting(hit)
        return fresh + revived


class ReservationLedger:
    """Blocks promised to running requests by a reserving policy.

    ``outstanding = sum(max(0, reserved_i - held_i))`` over requests with a reservation, kept
    incrementally. A policy that admits only when ``blocks_to_admit <= free - outstanding`` and
    whose reservations cover each request's growth never runs out of blocks.
    """

    __slots__ = ("_entries", "outstanding")

    def __init__(self) -> None:
        self._entries: dict[int, list[int]] = {}  # request id -> [reserved, held]
        self.outstanding = 0

    @property
    def active(self) -> bool:
        """Whether any running request holds a reservation."""
        return bool(self._entries)

    def add(self, rid: int, blocks: int, held: int) -> None:
        if blocks > 0:
            self._entries[rid] = [blocks, held]
            self.outstanding += max(0, blocks - held)

    def set(self, rid: int, blocks: int, held: int) -> None:
        """Replace ``rid``'s reservation (a policy refreshed its estimate); 0 removes it."""
        self.drop(rid)
        self.add(rid, blocks, held)

    def grew(self, rid: int, n: int) -> None:
        e = self._entries.get(rid)
        if e is not None:
            before = max(0, e[0] - e[1])
            e[1] += n
            self.outstanding += max(0, e[0] - e[1]) - before

    def drop(self, rid: int) -> None:
        e = self._entries.pop(rid, None)
        if e is not None:
            self.outstanding -= max(0, e[0] - e[1])

    def check(self, kv: KVCacheManager, running: dict[int, Request]) -> None:
        assert set(self._entries) <= set(running)
        for rid, (_, held) in self._entries.items():
            assert held == len(kv.blocks_of(running[rid])), f"ledger held mismatch for {rid}"
        want = sum(max(0, b - h) for b, h in self._entries.values())
        assert want == self.outstanding, f"reservation ledger {self.outstanding} != {want}"
