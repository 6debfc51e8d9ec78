"""The paged KV cache layout that every kernel here expects.

One tensor holds the whole cache::

    kv_cache[layer, side, block, offset, kv_head, dim]      side 0 = K, side 1 = V
    shape [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]

so a layer's K (``kv_cache[layer, 0]``) and V (``kv_cache[layer, 1]``) are each a contiguous
``[num_blocks, block_size, num_kv_heads, head_dim]`` view. ``block`` is a BlockPool block id as the
scheduler hands it out; a request's block table maps its logical block ``i`` (tokens
``[i * block_size, (i + 1) * block_size)``) to such an id. A token's *slot* is
``block * block_size + offset``, so with a contiguous view the KV write is one indexed copy into
``k.view(num_blocks * block_size, num_kv_heads, head_dim)``.

Why this order: a token's heads are adjacent (one row of ``head_dim`` elements per head), so a
kernel that reads one KV head of ``BLOCK_N`` tokens issues ``BLOCK_N`` contiguous row reads of
``head_dim * itemsize`` bytes (256 B for bf16, d=128), and writing a token touches one run of
``num_kv_heads * head_dim`` elements.

The kernels only need the last dim to be contiguous and K and V to share strides; separately
allocated K and V per layer work as well.
"""

from __future__ import annotations

import torch


def kv_cache_shape(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
) -> tuple[int, int, int, int, int, int]:
    """Shape of the engine's whole KV cache tensor (see the module docstring)."""
    return (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)


def allocate_kv_cache(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    """A zeroed cache ``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]``."""
    shape = kv_cache_shape(num_layers, num_blocks, block_size, num_kv_heads, head_dim)
    return torch.zeros(shape, dtype=dtype, device=device)


def layer_kv(kv_cache: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``layer``'s (K, V): contiguous views ``[num_blocks, block_size, kv_heads, dim]``."""
    if kv_cache.dim() != 6 or kv_cache.shape[1] != 2:
        raise ValueError(
            f"expected [layers, 2, blocks, block_size, kv_heads, dim], got {tuple(kv_cache.shape)}"
        )
    return kv_cache[layer, 0], kv_cache[layer, 1]
