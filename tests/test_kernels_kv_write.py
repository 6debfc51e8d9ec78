"""KV write: the Triton scatter against the torch reference, and the cache layout."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernel modules' import
pytest.importorskip("triton")

from executor.kernels import allocate_kv_cache, layer_kv, write_kv  # noqa: E402
from executor.kernels.testing import kernel_device  # noqa: E402

DEVICE = kernel_device()


def _slots(num_tokens: int, num_blocks: int, block_size: int, pad: int, gen) -> torch.Tensor:
    """Distinct random slots for the first num_tokens - pad tokens, -1 for the rest (shuffled)."""
    slots = torch.randperm(num_blocks * block_size, generator=gen)[: num_tokens - pad]
    slots = torch.cat([slots, torch.full((pad,), -1, dtype=slots.dtype)])
    return slots[torch.randperm(num_tokens, generator=gen)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("num_tokens", "kv_heads", "head_dim", "block_size", "pad"),
    [(1, 1, 16, 16, 0), (37, 2, 32, 16, 5), (64, 3, 64, 8, 0), (20, 8, 16, 32, 20)],
)
def test_write_kv_matches_reference(dtype, num_tokens, kv_heads, head_dim, block_size, pad):
    gen = torch.Generator().manual_seed(num_tokens * 7 + kv_heads)
    num_blocks = 2 + num_tokens // block_size + 1
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k0 = torch.randn(shape, generator=gen).to(dtype)
    v0 = torch.randn(shape, generator=gen).to(dtype)
    # key and value as slices of a fused projection: token stride != heads * dim.
    kv = torch.randn(num_tokens, 3, kv_heads, head_dim, generator=gen).to(dtype)
    key, value = kv[:, 0], kv[:, 2]
    slots = _slots(num_tokens, num_blocks, block_size, pad, gen)

    caches = {}
    for backend in ("torch", "triton"):
        k, v = k0.clone().to(DEVICE), v0.clone().to(DEVICE)
        write_kv(key.to(DEVICE), value.to(DEVICE), k, v, slots.to(DEVICE), backend=backend)
        caches[backend] = (k.cpu(), v.cpu())
    assert torch.equal(caches["torch"][0], caches["triton"][0])
    assert torch.equal(caches["torch"][1], caches["triton"][1])
    # Written rows hold the new K/V; every other slot is untouched.
    k_flat = caches["triton"][0].view(-1, kv_heads, head_dim)
    valid = slots >= 0
    assert torch.equal(k_flat[slots[valid]], key[valid])
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool)
    untouched[slots[valid]] = False
    assert torch.equal(k_flat[untouched], k0.view(-1, kv_heads, head_dim)[untouched])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_write_kv_into_layer_view_casts_and_touches_only_that_layer(backend):
    cache = allocate_kv_cache(3, 4, 8, 2, 16, torch.float16, DEVICE)
    k, v = layer_kv(cache, 1)
    assert k.is_contiguous() and v.is_contiguous()
    key = torch.randn(5, 2, 16, device=DEVICE)  # fp32 into an fp16 cache
    value = torch.randn(5, 2, 16, device=DEVICE)
    slots = torch.tensor([0, 9, -1, 31, 17], dtype=torch.int64, device=DEVICE)
    write_kv(key, value, k, v, slots, backend=backend)
    assert torch.equal(cache[1, 0, 1, 1], key[1].half())
    assert torch.equal(cache[1, 1, 3, 7], value[3].half())
    assert torch.count_nonzero(cache[0]) == 0 and torch.count_nonzero(cache[2]) == 0
    assert torch.count_nonzero(cache[1, 0]) == 4 * 2 * 16  # 4 valid tokens


def test_write_kv_rejects_bad_shapes():
    k, v = layer_kv(allocate_kv_cache(1, 2, 4, 2, 16, torch.float32, "cpu"), 0)
    key = torch.zeros(3, 2, 8)
    with pytest.raises(ValueError, match="heads or dim"):
        write_kv(key, key, k, v, torch.zeros(3, dtype=torch.int32), backend="torch")
    with pytest.raises(ValueError, match="unknown backend"):
        write_kv(key, key, k, v, torch.zeros(3, dtype=torch.int32), backend="cuda")
