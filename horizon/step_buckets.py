"""The batch sizes the engine pads a step to, so that it can replay a captured CUDA graph.

A step's GPU time follows its padded size, so the simulator's cost model reads the same rules
as the executor (``executor.runner``) applies; both import them from here.

    decode-only steps   padded to the next of ``decode_buckets(max_num_seqs)`` (sequences)
    mixed steps         padded to the next of ``mixed_token_buckets(max_num_batched_tokens)``
                        (tokens: decodes plus prefill chunks)
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256)


def decode_buckets(max_num_seqs: int, sizes: Sequence[int] = GRAPH_BATCH_SIZES) -> tuple[int, ...]:
    """``sizes`` up to ``max_num_seqs``, and ``max_num_seqs`` itself."""
    out = sorted({s for s in sizes if 0 < s <= max_num_seqs})
    if not out or out[-1] < max_num_seqs:
        out.append(max_num_seqs)
    return tuple(out)


def mixed_token_buckets(max_num_batched_tokens: int) -> tuple[int, ...]:
    """Token counts a mixed step is padded to: steps of 32 up to 256, of 64 up to 1024, of 128
    beyond (padding costs at most ~1/8 of a large step's GEMMs), and the budget itself."""
    sizes = [*range(32, 257, 32), *range(320, 1025, 64), *range(1152, max_num_batched_tokens, 128)]
    budget = max_num_batched_tokens
    return tuple(sorted({b for b in sizes if b < budget} | {budget}))


def bucket_of(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= ``n`` (``n`` itself past the largest: an unpadded step)."""
    i = bisect.bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else n
