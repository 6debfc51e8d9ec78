"""``CausalLM.forward``'s function with fused kernels, for the runner on the GPU.

The reference decoder (``executor.model``) spells RMSNorm, RoPE and SwiGLU as plain torch ops:
about forty kernels per layer, each a few microseconds even on a one-token batch, which is most
of a small decode step (a Qwen2.5-0.5B step reads 1 GB of weights in ~0.25 ms; forty kernels
times 24 layers take ~2 ms). Here a layer is nine launches (ten with a split-K merge):

    add+RMSNorm | QKV GEMM | RoPE (q in place; k, v into the paged cache) | attention |
    O GEMM | add+RMSNorm | gate/up GEMM | SiLU*up | down GEMM

over the same parameters (no copies). At one token the projections of a small model are Triton
GEMVs (``executor.gemv``; SiLU*up and the down projection one kernel), faster there than
cuBLAS. Rounding is where the reference rounds: each torch op on bf16 rounds its fp32 result to
bf16, and the kernels do the same at the same points, so outputs match the reference to the
last bit or within an ulp (``tests/test_runner_fused.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from executor.attention import PagedAttention
from executor.gemv import fits as gemv_fits
from executor.gemv import gemv, swiglu_down
from executor.kernels.tiling import next_pow2
from executor.model import Attention, CausalLM


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    y_ptr,
    stride_x,
    stride_r,
    stride_y,
    n,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:  # residual += x (rounded as a torch add), then normalise the sum
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n
    normed = (xf / tl.sqrt(var + eps)).to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (w * normed).to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """``RMSNorm(x)``, or with ``residual``: ``residual += x`` (**in place**) then
    ``RMSNorm(residual)``. ``x``, ``residual``: ``[T, n]`` with contiguous rows."""
    t, n = x.shape
    y = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t == 0:
        return y
    res = x if residual is None else residual
    _rms_norm_kernel[(t,)](
        x,
        res,
        weight,
        y,
        x.stride(0),
        res.stride(0),
        y.stride(0),
        n,
        eps,
        HAS_RES=residual is not None,
        BLOCK=next_pow2(n),
        num_warps=4 if n <= 2048 else 8,
    )
    return y


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, stride_gu, stride_o, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + n + cols, mask=mask, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)  # F.silu rounds, then the product does
    tl.store(out_ptr + row * stride_o + cols, (s * u).to(dt), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up = [gate | up]`` ``[T, 2n]`` -> ``[T, n]``."""
    t, n2 = gate_up.shape
    n = n2 // 2
    out = torch.empty((t, n), dtype=gate_up.dtype, device=gate_up.device)
    if t == 0:
        return out
    block = min(1024, next_pow2(n))
    _silu_mul_kernel[(t, triton.cdiv(n, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), n, BLOCK=block, num_warps=4
    )
    return out


@triton.jit
def _rotate(
    src,
    src_stride_h,
    dst,
    dst_stride_h,
    num_heads,
    cos,
    sin,
    d,
    d_mask,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    h = tl.arange(0, BLOCK_H)
    mask = (h[:, None] < num_heads) & d_mask[None, :]
    src_ptr = src + h[:, None] * src_stride_h + d[None, :]
    dst_ptr = dst + h[:, None] * dst_stride_h + d[None, :]
    dt = src.dtype.element_ty
    x1 = tl.load(src_ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src_ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    # x1*cos - x2*sin, x2*cos + x1*sin, each product and sum rounded as the torch ops round
    a = (x1 * cos).to(dt).to(tl.float32)
    b = (x2 * sin).to(dt).to(tl.float32)
    c = (x2 * cos).to(dt).to(tl.float32)
    e = (x1 * sin).to(dt).to(tl.float32)
    out_t = dst.dtype.element_ty
    tl.store(dst_ptr, (a - b).to(dt).to(out_t), mask=mask)
    tl.store(dst_ptr + HALF, (c + e).to(dt).to(out_t), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cos_sin_ptr,
    pos_ptr,
    slot_ptr,
    k_cache_ptr,
    v_cache_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cs,
    stride_cb,
    stride_ct,
    stride_ch,
    block_size,
    NUM_Q_HEADS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_D: tl.constexpr,
    STORE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HALF
    dt = q_ptr.dtype.element_ty
    cos = tl.load(cos_sin_ptr + p * stride_cs + d, mask=d_mask, other=0.0)
    sin = tl.load(cos_sin_ptr + p * stride_cs + HALF + d, mask=d_mask, other=0.0)
    cos = cos.to(dt).to(tl.float32)[None, :]  # the reference casts cos/sin to the model dtype
    sin = sin.to(dt).to(tl.float32)[None, :]
    q = q_ptr + t * stride_qt
    _rotate(q, stride_qh, q, stride_qh, NUM_Q_HEADS, cos, sin, d, d_mask, HALF, BLOCK_QH)
    k = k_ptr + t * stride_kt
    if STORE:  # rotated K and V straight into the paged cache (slot -1: padding, skipped)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            dst = (slot // block_size) * stride_cb + (slot % block_size) * stride_ct
            _rotate(
                k, stride_kh, k_cache_ptr + dst, stride_ch, NUM_K_HEADS, cos, sin, d, d_mask,
                HALF, BLOCK_KH,
            )  # fmt: skip
            h = tl.arange(0, BLOCK_KH)
            dd = tl.arange(0, 2 * BLOCK_D)
            mask = (h[:, None] < NUM_K_HEADS) & (dd[None, :] < 2 * HALF)
            v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + dd[None, :], mask=mask)
            v_dst = v_cache_ptr + dst + h[:, None] * stride_ch + dd[None, :]
            tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)
    else:
        _rotate(k, stride_kh, k, stride_kh, NUM_K_HEADS, cos, sin, d, d_mask, HALF, BLOCK_KH)


def rope_(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin: torch.Tensor,
    positions: torch.Tensor,
    v: torch.Tensor | None = None,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
) -> None:
    """Rotate ``q`` ``[T, Hq, D]`` **in place** (neox style) at ``positions``; ``cos_sin``:
    ``[max_positions, D]`` fp32, cos then sin halves. Without caches ``k`` ``[T, Hk, D]`` is
    rotated in place too; with ``v``, ``k_cache``, ``v_cache`` (one layer's paged caches) and
    ``slot_mapping``, rotated K and V are written into the caches (**mutated**) instead, as
    ``executor.kernels.write_kv`` would, and ``k`` is left as it was."""
    t, hq, d = q.shape
    if t == 0:
        return
    half = d // 2
    store = k_cache is not None
    if store:
        cache_strides = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.shape[1])
        v_args = (v, slot_mapping, k_cache, v_cache)
        v_strides = (v.stride(0), v.stride(1))
    else:
        cache_strides = (0, 0, 0, 1)
        v_args = (k, positions, k, k)  # unused
        v_strides = (0, 0)
    _rope_kernel[(t,)](
        q,
        k,
        v_args[0],
        cos_sin,
        positions,
        v_args[1],
        v_args[2],
        v_args[3],
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        *v_strides,
        cos_sin.stride(0),
        *cache_strides,
        NUM_Q_HEADS=hq,
        NUM_K_HEADS=k.shape[1],
        HALF=half,
        BLOCK_QH=next_pow2(hq),
        BLOCK_KH=next_pow2(k.shape[1]),
        BLOCK_D=next_pow2(half),
        STORE=store,
        num_warps=4,
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):  # noqa: ANN201
    """``F.linear``, by ``executor.gemv`` for one token and a small weight."""
    if gemv_fits(x, weight):
        return gemv(x, weight, bias)
    return F.linear(x, weight, bias)


def swiglu_mlp(x: torch.Tensor, gate_up_weight: torch.Tensor, down_weight: torch.Tensor):  # noqa: ANN201
    """``down(SiLU(gate) * up)`` of ``x``: the gate/up projection, then SiLU*up and the down
    projection (one kernel at one token and a small weight)."""
    gate_up = linear(x, gate_up_weight)
    if gemv_fits(gate_up, down_weight):
        return swiglu_down(gate_up, down_weight)
    return F.linear(silu_mul(gate_up), down_weight)


class FusedForward:
    """Callable like ``model.forward`` (same arguments, same result) with the kernels above.
    Reads the model's parameters at every call (weights loaded later are used)."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        c = model.config
        self.eps = c.rms_norm_eps
        self.sizes = (c.q_size, c.kv_size, c.kv_size)
        self.heads = (c.num_heads, c.num_kv_heads, c.head_dim)

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention
    ) -> torch.Tensor:
        m, eps = self.model, self.eps
        nh, nkv, hd = self.heads
        cos_sin = m.rotary.cos_sin_cache
        h = m.embed_tokens(input_ids)
        t = h.shape[0]
        residual = None
        for i, layer in enumerate(m.layers):
            if residual is None:
                residual = h
                x = rms_norm(h, layer.input_layernorm.weight, eps)
            else:
                x = rms_norm(h, layer.input_layernorm.weight, eps, residual)
            att = layer.self_attn
            qkv = linear(x, att.qkv_proj.weight, att.qkv_proj.bias)
            q, k, v = qkv.split(self.sizes, dim=-1)
            q, k, v = q.view(t, nh, hd), k.view(t, nkv, hd), v.view(t, nkv, hd)
            if isinstance(attention, PagedAttention):  # RoPE writes K/V into the cache
                rope_(
                    q, k, cos_sin, positions, v, attention.k_caches[i], attention.v_caches[i],
                    attention.slot_mapping,
                )  # fmt: skip
                o = attention.attend(i, q)
            else:
                rope_(q, k, cos_sin, positions)
                o = attention(i, q, k, v)
            h = linear(o.reshape(t, nh * hd), att.o_proj.weight, att.o_proj.bias)
            x = rms_norm(h, layer.post_attention_layernorm.weight, eps, residual)
            h = swiglu_mlp(x, layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight)
        return rms_norm(h, m.norm.weight, eps, residual)
