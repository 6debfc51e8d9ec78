"""BlockPool: unit behaviour and a random-operation property test (check_integrity each op)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horizon.block_pool import BlockPool


def test_fresh_pool_hands_out_ids_in_order_and_all_or_nothing():
    pool = BlockPool(4, 16)
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.allocate(2) is None  # only one left: nothing changes
    assert pool.num_free == 1 and pool.num_used == 3
    pool.check_integrity()


def test_release_to_zero_frees_and_double_free_asserts():
    pool = BlockPool(2, 16)
    blocks = pool.allocate(2)
    pool.release(blocks)
    assert pool.num_free == 2
    with pytest.raises(AssertionError, match="double free"):
        pool.release([blocks[0]])


def test_cached_blocks_are_matched_adopted_and_evicted_last():
    pool = BlockPool(3, 4)
    a, b, c = pool.allocate(3)
    assert pool.register(a, 111) and pool.register(b, 222)
    assert not pool.register(c, 111)  # hash taken: the older block keeps it
    pool.release([a, b])
    pool.release([c])
    assert pool.match([111, 222, 333]) == [a, b]
    assert pool.num_free_after_adopting([a, b]) == 1
    pool.adopt([a])
    assert pool.ref_count(a) == 1 and pool.num_free == 2
    # plain block c goes first; then the least recently freed cached block (b before a? a is
    # adopted, so b is the only cached free block)
    assert pool.allocate(1) == [c]
    assert pool.allocate(1) == [b]
    assert pool.match([111, 222]) == [a]  # b's hash was dropped on eviction
    pool.check_integrity()


def test_release_order_evicts_deepest_block_of_a_prefix_first():
    pool = BlockPool(2, 4)
    x, y = pool.allocate(2)
    pool.register(x, 1)
    pool.register(y, 2)
    pool.release([x, y])  # walked backwards: y enters the LRU first, so is evicted first
    assert pool.allocate(1) == [y]
    assert pool.match([1]) == [x]


def test_bad_sizes_raise_naming_the_field():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0, 16)
    with pytest.raises(ValueError, match="block_size"):
        BlockPool(4, 0)


def _random_ops(pool: BlockPool, rng: random.Random, n_ops: int) -> int:
    """Random allocate / release / register / match+adopt with a model of who holds what."""
    held: list[list[int]] = []  # each entry is one holder's references
    next_hash = 1
    for _ in range(n_ops):
        op = rng.random()
        if op < 0.35:
            n = rng.randint(1, 4)
            before = pool.num_free
            got = pool.allocate(n)
            if got is None:
                assert before < n and pool.num_free == before
            else:
                assert len(set(got)) == n and all(pool.ref_count(b) == 1 for b in got)
                held.append(got)
        elif op < 0.65 and held:
            pool.release(held.pop(rng.randrange(len(held))))
        elif op < 0.8 and held:
            blocks = rng.choice(held)
            b = rng.choice(blocks)
            if pool._hash[b] is None:  # noqa: SLF001 - the test models the pool's state
                pool.register(b, next_hash if rng.random() < 0.8 else rng.randint(1, next_hash))
                next_hash += 1
        else:
            hashes = [rng.randint(1, next_hash) for _ in range(rng.randint(1, 3))]
            hit = pool.match(hashes)
            if hit:
                pool.adopt(hit)
                held.append(hit)
        pool.check_integrity()
        used = {b for h in held for b in h}
        assert pool.num_used == len(used)
    for h in held:
        pool.release(h)
    pool.check_integrity()
    assert pool.num_free == pool.num_blocks
    return n_ops


def test_random_operations_never_leak_or_double_free(scale):
    total = 0

    @settings(max_examples=200 * scale, deadline=None, derandomize=True)
    @given(st.integers(1, 64), st.sampled_from([1, 4, 16]), st.integers(0, 2**32))
    def run(num_blocks, block_size, seed):
        nonlocal total
        total += _random_ops(BlockPool(num_blocks, block_size), random.Random(seed), 500)

    run()
    assert total >= 100_000 * scale
