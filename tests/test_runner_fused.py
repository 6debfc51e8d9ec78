"""The runner's fused forward (Triton RMSNorm, RoPE, SiLU*up; interpreter on the CPU) computes
the reference decoder's function."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernel modules' import
pytest.importorskip("triton")

from executor.fused import FusedForward, rms_norm, rope_, silu_mul  # noqa: E402
from executor.model import CausalLM, DenseAttention, DenseKVCache  # noqa: E402
from executor.model.layers import apply_rope  # noqa: E402
from executor.model.testing import tiny_config  # noqa: E402
from executor.weights import random_weights  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter converts fp32 -> bf16 by truncation, not rounding, so bf16 is checked on the
# GPU (executor.check); fp16 rounds like the GPU.
DTYPES = [torch.float32, torch.float16]
TOL = {torch.float32: 1e-5, torch.float16: 4e-3}


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_match_the_torch_ops(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=g).to(DEVICE, dtype)
    res = torch.randn(5, 96, generator=g).to(DEVICE, dtype)
    w = torch.randn(96, generator=g).to(DEVICE, dtype)

    def ref_norm(v):
        v32 = v.float()
        return w * (v32 * torch.rsqrt(v32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)

    tol = TOL[dtype]
    torch.testing.assert_close(rms_norm(x, w, 1e-6), ref_norm(x), atol=tol, rtol=tol)
    summed = res + x
    got = rms_norm(x, w, 1e-6, res)
    assert torch.equal(res, summed)  # residual updated in place, rounded like the torch add
    torch.testing.assert_close(got, ref_norm(summed), atol=tol, rtol=tol)
    gu = torch.randn(3, 2 * 80, generator=g).to(DEVICE, dtype)
    gate, up = gu.chunk(2, dim=-1)
    torch.testing.assert_close(
        silu_mul(gu), torch.nn.functional.silu(gate) * up, atol=tol, rtol=tol
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_in_place_on_strided_views(dtype):
    model = CausalLM(tiny_config(num_key_value_heads=2), device=DEVICE, dtype=dtype)
    c = model.config
    t = 7
    qkv = torch.randn(t, c.q_size + 2 * c.kv_size).to(DEVICE, dtype)
    q, k, _ = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
    q, k = q.view(t, c.num_heads, c.head_dim), k.view(t, c.num_kv_heads, c.head_dim)
    positions = torch.tensor([0, 1, 2, 50, 51, 200, 3], device=DEVICE)
    cos, sin = model.rotary(positions, dtype)
    want_q, want_k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    v_before = qkv[:, c.q_size + c.kv_size :].clone()
    rope_(q, k, model.rotary.cos_sin_cache, positions.to(torch.int32))
    if DEVICE == "cpu":  # the interpreter rounds exactly as the torch ops
        assert torch.equal(q, want_q) and torch.equal(k, want_k)
    else:  # the GPU fuses the rotation's multiply-adds: within an ulp of each element
        ulp = torch.finfo(dtype).eps
        torch.testing.assert_close(q, want_q, atol=ulp, rtol=ulp)
        torch.testing.assert_close(k, want_k, atol=ulp, rtol=ulp)
    assert torch.equal(qkv[:, c.q_size + c.kv_size :], v_before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_fused_forward_equals_the_reference_decoder(dtype, model_type):
    model = CausalLM(tiny_config(model_type), device=DEVICE, dtype=dtype)
    random_weights(model, 3, std=0.2)
    ids = torch.randint(0, 512, (13,), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    positions = torch.cat([torch.arange(8), torch.arange(5)]).to(DEVICE)
    out = []
    for forward in (model, FusedForward(model)):
        caches = [DenseKVCache(model.config.num_layers) for _ in range(2)]
        attention = DenseAttention([8, 5], caches, model.config.attention_scale)
        with torch.no_grad():
            out.append(forward(ids, positions, attention))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out[1], out[0], atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_writes_rotated_kv_into_the_paged_cache(dtype):
    from executor.kernels import allocate_kv_cache, layer_kv, write_kv

    model = CausalLM(tiny_config(num_key_value_heads=2), device=DEVICE, dtype=dtype)
    c = model.config
    t = 6
    qkv = torch.randn(t, c.q_size + 2 * c.kv_size).to(DEVICE, dtype)
    q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
    shape = (t, -1, c.head_dim)
    q, k, v = q.view(shape), k.view(shape), v.view(shape)
    positions = torch.tensor([3, 4, 5, 0, 1, 9], device=DEVICE, dtype=torch.int32)
    slots = torch.tensor([13, 14, -1, 2, 3, 30], device=DEVICE, dtype=torch.int32)
    want_cache = allocate_kv_cache(1, 8, 4, c.num_kv_heads, c.head_dim, dtype, DEVICE)
    got_cache = want_cache.clone()
    want_q, want_k = q.clone(), k.clone()
    rope_(want_q, want_k, model.rotary.cos_sin_cache, positions)
    write_kv(want_k, v, *layer_kv(want_cache, 0), slots, backend="torch")
    k_before = k.clone()
    rope_(q, k, model.rotary.cos_sin_cache, positions, v, *layer_kv(got_cache, 0), slots)
    assert torch.equal(q, want_q) and torch.equal(k, k_before)
    assert torch.equal(got_cache, want_cache)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(13, 40), (896, 1100), (6, 2048)])
def test_single_token_gemvs_are_the_torch_ops(dtype, n, k):
    """``gemv`` (with and without bias) and ``swiglu_down`` at one token: tiles that do not
    divide n or k, one reduction exactly two chunks long, and a multi-feature tile."""
    from executor.gemv import fits, gemv, swiglu_down

    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=g).to(dtype).to(DEVICE)
    gu = torch.randn(1, 2 * k, generator=g).to(dtype).to(DEVICE)
    w = (0.05 * torch.randn(n, k, generator=g)).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE)
    linear = torch.nn.functional.linear
    cases = [
        (gemv(x, w), linear(x, w)),
        (gemv(x, w, b), linear(x, w, b)),
        (gemv(x, w, b, tiles=(4, 256, 2)), linear(x, w, b)),
        (swiglu_down(gu, w), linear(silu_mul(gu), w)),
    ]
    for got, want in cases:
        assert got.dtype == dtype and got.shape == (1, n)
        scale = want.float().abs().max().item()
        torch.testing.assert_close(
            got.float(), want.float(), atol=TOL[dtype] * scale, rtol=TOL[dtype]
        )
    assert fits(x, w) and not fits(torch.cat([x, x]), w)
    with pytest.raises(ValueError, match="gate_up"):
        swiglu_down(torch.cat([gu, gu]), w)
    with pytest.raises(ValueError, match="gemv takes"):
        gemv(gu, w)
