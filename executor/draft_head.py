"""A draft head in EAGLE-3's layout on a target's width, with seeded random weights: the kind of
draft model serving engines pair with a 7B-class target, priced by its own forward.

EAGLE-3 (as SGLang's and vLLM's EAGLE-3 models are laid out) drafts with one decoder layer
of the target's width that reads two things per token: the token's embedding and a
*feature*, 3 of the target's hidden states fused by a linear layer (``fc``: 3h -> h) at the
first draft position, the head's own previous output after it. Per token:

    e = embed(token)                 (the target's embedding rows)
    x = [input_norm(e) ; hidden_norm(f)]                  2h wide
    h = f + o_proj(attention(qkv_proj(x)))               qkv_proj: 2h -> q + 2 kv
    h = h + mlp(post_attention_norm(h))                   the target's intermediate size
    logits = lm_head(norm(h))                             h -> draft vocabulary (32,000)
    next feature = h;  draft id = d2t[argmax logits]      d2t: draft ids -> target ids

Here the weights are seeded random (its drafts mean nothing: it serves stated acceptance,
where only its cost counts) and the target's hidden states are a stand-in buffer (the runner
does not hand them over; their values change no cost). What the forward reads and launches is
the layout's: one layer's weights with the doubled QKV input, the 32,000-row head, the fusion
layer once per proposal (``begin_proposal``) and once per prefilled prompt token.

``DraftHead`` is used where ``executor.paged_draft`` takes a ``CausalLM``: ``config`` (one
layer, the target's heads, the target's vocabulary for the embedding), ``embed_tokens``,
``forward(ids, positions, attention)`` (hidden states after the final norm), ``greedy_tokens``,
``begin_proposal`` and ``graph_state``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from executor.model import Attention, ModelConfig
from executor.model.layers import (
    MLP,
    Embedding,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    apply_rope,
)
from horizon.step_buckets import GRAPH_BATCH_SIZES

DRAFT_VOCAB = 32_000  # EAGLE-3's draft vocabulary for Llama-3 and Qwen targets
GRAPH_TOKENS = 2 * GRAPH_BATCH_SIZES[-1]  # the paged drafter's largest graph: two tokens a row


class DraftHead(nn.Module):
    """The EAGLE-3 layout over ``target``'s config (see the module docstring).

    Contracts:
        * ``begin_proposal(n)`` sets the features of the next forward's first ``n`` tokens
          from the (stand-in) target hidden states through ``fc``; a forward of ``T`` tokens
          reads the features of its ``T`` tokens (``T <= n`` since the last ``begin_proposal``,
          or rows ``greedy_tokens`` wrote).
        * ``greedy_tokens(hidden, rows)`` returns the rows' draft ids mapped to target ids
          (int32) and makes those rows' pre-norm outputs the next forward's features.
        * ``forward`` has no host synchronisation or data-dependent shape (capturable), given
          features already sized for its ``T`` (``begin_proposal`` sizes them, eagerly).
    """

    def __init__(
        self,
        target: ModelConfig,
        draft_vocab: int = DRAFT_VOCAB,
        device=None,  # noqa: ANN001
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= target.vocab_size:
            top = target.vocab_size
            raise ValueError(
                f"DraftHead.draft_vocab must be an int in 1..{top}, got {draft_vocab!r}"
            )
        shape = dataclasses.replace(target.shape, name=f"{target.name}-eagle3-head", num_layers=1)
        self.config = c = dataclasses.replace(target, shape=shape)
        self.draft_vocab = draft_vocab
        dtype = dtype or c.torch_dtype
        kw = {"device": device, "dtype": dtype}
        h, eps = c.hidden_size, c.rms_norm_eps
        self.embed_tokens = Embedding(c.vocab_size, h, **kw)
        self.fc = Linear(3 * h, h, bias=False, **kw)
        self.input_layernorm, self.hidden_norm = RMSNorm(h, eps, **kw), RMSNorm(h, eps, **kw)
        self.qkv_proj = Linear(2 * h, c.q_size + 2 * c.kv_size, bias=c.qkv_bias, **kw)
        self.o_proj = Linear(c.q_size, h, bias=False, **kw)
        self.post_attention_layernorm = RMSNorm(h, eps, **kw)
        self.mlp = MLP(c, **kw)
        self.norm = RMSNorm(h, eps, **kw)
        self.lm_head = Linear(h, draft_vocab, bias=False, **kw)
        self.rotary = RotaryEmbedding(c, device=device)
        # draft id -> target id (the most frequent target tokens, in a trained head)
        self.register_buffer("d2t", torch.arange(draft_vocab, device=device), persistent=False)
        # features of up to GRAPH_TOKENS tokens in one fixed buffer (captured graphs read it);
        # a longer forward (a prompt's prefill, eager) gets its own; the target's hidden
        # states are a stand-in of zeros
        self._target_hidden = torch.zeros((GRAPH_TOKENS, 3 * h), **kw)
        self._feature = torch.zeros((GRAPH_TOKENS, h), **kw)
        self._wide: torch.Tensor | None = None
        self._out: torch.Tensor | None = None  # the last forward's pre-norm output

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.lm_head.weight

    def begin_proposal(self, n: int) -> None:
        """The features of the next forward's first ``n`` tokens: ``fc`` of the target's
        hidden states (eager; more than ``GRAPH_TOKENS``: a buffer of their own, for one
        eager forward)."""
        w = self.fc.weight
        if n <= GRAPH_TOKENS:
            self._wide = None
            self._feature[:n].copy_(F.linear(self._target_hidden[:n], w))
        else:
            stand_in = torch.zeros((n, 3 * self.config.hidden_size), dtype=w.dtype, device=w.device)
            self._wide = F.linear(stand_in, w)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: Attention,
        kernels: str = "torch",
    ) -> torch.Tensor:
        """Hidden states after the final norm, ``[T, hidden_size]`` (see the contracts), by the
        reference ops (``kernels="torch"``) or ``executor.fused``'s (``"triton"``)."""
        t, c, fused = input_ids.shape[0], self.config, kernels == "triton"
        f = self._feature[:t] if t <= GRAPH_TOKENS else self._wide
        assert f is not None and f.shape[0] == t, "DraftHead: begin_proposal(n >= T) first"
        e = self.embed_tokens(input_ids)
        x = torch.cat(
            [_norm(e, self.input_layernorm, fused), _norm(f, self.hidden_norm, fused)], -1
        )
        q, k, v = _linear(x, self.qkv_proj.weight, self.qkv_proj.bias, fused).split(
            [c.q_size, c.kv_size, c.kv_size], dim=-1
        )
        q = q.reshape(t, c.num_heads, c.head_dim)
        k, v = k.reshape(t, c.num_kv_heads, c.head_dim), v.reshape(t, c.num_kv_heads, c.head_dim)
        o = self._attend(q, k, v, positions, attention, fused)
        h = f + _linear(o.reshape(t, c.q_size), self.o_proj.weight, None, fused)
        m = _mlp(self.mlp, _norm(h, self.post_attention_layernorm, fused), fused)
        if fused:  # h += m in place, then the final norm: one kernel
            from executor.fused import rms_norm

            y = rms_norm(m, self.norm.weight, self.norm.eps, h)
        else:
            h = h + m
            y = self.norm(h)
        self._out = h
        return y

    def greedy_tokens(self, hidden: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """Draft ids of ``hidden[rows]`` as target ids (int32); their pre-norm outputs become
        the next forward's features (rows 0..)."""
        assert self._out is not None, "DraftHead.greedy_tokens before a forward"
        out = self._out[rows]
        if out.shape[0] <= GRAPH_TOKENS:
            self._feature[: out.shape[0]].copy_(out)
        else:  # more rows than the fixed buffer (eager): the next forward reads them from here
            self._wide = out.clone()
        ids = F.linear(hidden[rows], self.lm_head.weight).argmax(-1)
        return self.d2t[ids].to(torch.int32)

    def graph_state(self) -> list[torch.Tensor]:
        """What a captured forward reads besides its inputs: the features (a drafter keeps
        them across a capture made mid-proposal)."""
        return [self._feature]

    def _attend(self, q, k, v, positions, attention: Attention, fused: bool) -> torch.Tensor:  # noqa: ANN001
        if fused:
            from executor.attention import PagedAttention
            from executor.fused import rope_

            if isinstance(attention, PagedAttention):  # RoPE writes K/V into the cache
                rope_(
                    q, k, self.rotary.cos_sin_cache, positions, v, attention.k_caches[0],
                    attention.v_caches[0], attention.slot_mapping,
                )  # fmt: skip
                return attention.attend(0, q)
        cos, sin = self.rotary(positions, q.dtype)
        return attention(0, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)


# -- kernels: the reference ops, or executor.fused's on the GPU ----------------------------------
def _norm(x: torch.Tensor, norm: RMSNorm, fused: bool) -> torch.Tensor:
    if fused:
        from executor.fused import rms_norm

        return rms_norm(x, norm.weight, norm.eps)
    return norm(x)


def _linear(x, weight, bias, fused: bool) -> torch.Tensor:  # noqa: ANN001
    if fused:
        from executor.fused import linear

        return linear(x, weight, bias)
    return F.linear(x, weight, bias)


def _mlp(mlp: MLP, x: torch.Tensor, fused: bool) -> torch.Tensor:
    if fused:
        from executor.fused import swiglu_mlp

        return swiglu_mlp(x, mlp.gate_up_proj.weight, mlp.down_proj.weight)
    return mlp(x)


def draft_head_of(
    target: ModelConfig, dtype: str, device: str, seed: int = 0, draft_vocab: int | None = None
) -> DraftHead:
    """A ``DraftHead`` over ``target`` with seeded random weights (``executor.bench``'s);
    ``draft_vocab`` by default ``DRAFT_VOCAB``, or the target's vocabulary where smaller."""
    from executor.bench import device_random_weights

    if draft_vocab is None:
        draft_vocab = min(DRAFT_VOCAB, target.vocab_size)
    head = DraftHead(target, draft_vocab, device=device, dtype=getattr(torch, dtype))
    device_random_weights(head, seed)
    return head.eval()
