"""Batched token sampling from fp32 logits with per-request parameters and seeds.

Randomness is counter-based: request ``r``'s draw at step ``s`` uses one uniform number hashed
from ``(seed_r, s)``, turned into a token by inverting the CDF of the filtered distribution (in
vocabulary order).
So the same seed, step and logits give the same token whatever else is in the batch and in
whatever order; nothing reads back to the host, and there is no per-request Python loop.

Filters apply in HF's order to the temperature-scaled distribution: top-k, then top-p (the
smallest set of most likely tokens whose mass reaches ``top_p``), then min-p (tokens at least
``min_p`` times as likely as the most likely one). The most likely token always survives.

A row may also forbid some tokens while it is young: ``suppress_ids`` cannot be drawn while
the row's step (tokens generated so far) is below ``min_tokens`` (vLLM's ``min_tokens``, which
holds off the end-of-sequence ids).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters. ``temperature == 0`` means greedy (the others are then
    ignored); ``top_k == 0`` and ``top_p == 1`` and ``min_p == 0`` switch those filters off.

    Give each request its own ``seed`` (e.g. derived from a run seed and the request id):
    requests sharing a seed and step draw the same random number.

    ``suppress_ids`` are never drawn (greedy or not) while fewer than ``min_tokens`` tokens
    have been generated."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    min_tokens: int = 0
    suppress_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def needs_sampler(self) -> bool:
        """Whether a plain argmax of the logits is not this request's token: it samples, or
        it may have tokens to suppress."""
        return not self.greedy or bool(self.min_tokens and self.suppress_ids)


@dataclass(frozen=True)
class SamplingBatch:
    """Per-row sampling parameters as tensors on the logits' device, plus host-side flags that
    let ``sample`` skip work no row needs (so building one costs no device synchronisation).

    ``step`` is the row's draw counter (e.g. tokens the request has generated so far): two
    draws with the same seed and step use the same random number.
    """

    temperature: torch.Tensor  # [N] float32, 0 = greedy
    top_k: torch.Tensor  # [N] int64, 0 = off
    top_p: torch.Tensor  # [N] float32
    min_p: torch.Tensor  # [N] float32
    seed: torch.Tensor  # [N] int64
    step: torch.Tensor  # [N] int64
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool
    any_min_p: bool
    suppress: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, token ids) at -inf

    @classmethod
    def from_params(
        cls, params: Sequence[SamplingParams], steps: Sequence[int], device=None
    ) -> SamplingBatch:
        if len(params) != len(steps):
            raise ValueError(f"{len(params)} params for {len(steps)} steps")
        sampled = [p for p in params if not p.greedy]

        def col(values, dtype):
            return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

        return cls(
            temperature=col([p.temperature for p in params], torch.float32),
            top_k=col([p.top_k for p in params], torch.int64),
            top_p=col([p.top_p for p in params], torch.float32),
            min_p=col([p.min_p for p in params], torch.float32),
            seed=col([p.seed for p in params], torch.int64),
            step=col(list(steps), torch.int64),
            all_greedy=not sampled,
            any_top_k=any(p.top_k > 0 for p in sampled),
            any_top_p=any(p.top_p < 1 for p in sampled),
            any_min_p=any(p.min_p > 0 for p in sampled),
            suppress=_suppressed(params, steps, device),
        )

    def __len__(self) -> int:
        return self.temperature.shape[0]


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """One token per row of ``logits`` ``[N, vocab]`` (fp32): ``[N]`` int64 on its device.

    Greedy rows take the argmax (lowest index among ties). Does not modify ``logits``.
    """
    if logits.dim() != 2 or logits.shape[0] != len(batch):
        raise ValueError(f"logits {tuple(logits.shape)} do not match a batch of {len(batch)}")
    if batch.suppress is not None:
        logits = logits.index_put(batch.suppress, torch.tensor(float("-inf"), device=logits.device))
    greedy = logits.argmax(dim=-1)
    if batch.all_greedy:
        return greedy
    probs = torch.softmax(filtered_logits(logits, batch), dim=-1)
    token = _invert_cdf(probs, uniform(batch.seed, batch.step))
    return torch.where(batch.temperature > 0, token, greedy)


def _suppressed(
    params: Sequence[SamplingParams], steps: Sequence[int], device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (row, token id) pairs that rows still below their ``min_tokens`` may not draw."""
    rows, ids = [], []
    for i, (p, step) in enumerate(zip(params, steps)):
        if step < p.min_tokens:
            rows += [i] * len(p.suppress_ids)
            ids += p.suppress_ids
    if not rows:
        return None
    t = torch.tensor([rows, ids], dtype=torch.int64).to(device, non_blocking=True)
    return t[0], t[1]


def filtered_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The temperature-scaled logits that ``sample`` draws from, dropped tokens at -inf (greedy
    rows scaled by 1). A row's values do not depend on the other rows' parameters, so neither
    does its token: the sort that top-k / top-p need is skipped when no row needs it, and is
    undone before sampling."""
    temperature = torch.where(batch.temperature > 0, batch.temperature, 1.0)
    scaled = logits.float() / temperature[:, None]
    if batch.any_top_k or batch.any_top_p:
        vals, idx = _filter_sorted(scaled, batch)
        return torch.empty_like(vals).scatter_(1, idx, vals)
    if batch.any_min_p:
        return _min_p_mask(scaled, scaled.amax(dim=-1, keepdim=True), batch.min_p)
    return scaled


def _filter_sorted(scaled: torch.Tensor, batch: SamplingBatch):
    """Each row's scaled logits sorted descending (ties by index), dropped ones set to -inf,
    and their vocabulary indices."""
    vals, idx = scaled.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(vals.shape[-1], device=vals.device)
    drop = torch.zeros_like(vals, dtype=torch.bool)
    if batch.any_top_k:
        k = torch.where(batch.top_k > 0, batch.top_k, vals.shape[-1])
        drop |= rank[None, :] >= k[:, None]
    if batch.any_top_p:
        probs = torch.softmax(vals.masked_fill(drop, float("-inf")), dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= (mass_before >= batch.top_p[:, None]) & (batch.top_p[:, None] < 1)
    vals = vals.masked_fill(drop, float("-inf"))
    if batch.any_min_p:
        vals = _min_p_mask(vals, vals[:, :1], batch.min_p)
    return vals, idx


def _min_p_mask(scaled: torch.Tensor, top: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens with p < min_p * p_max, i.e. scaled logit < max + log(min_p)."""
    return scaled.masked_fill(scaled < top + torch.log(min_p)[:, None], float("-inf"))


def _invert_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """For each row, the first index whose cumulative probability exceeds ``u`` times the row's
    total (never a zero-probability token: the target stays below the total)."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    target = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


def uniform(seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """``[N]`` float32 in ``[0, 1)`` with 24 random bits, a pure function of ``(seed, step)``.

    Arithmetic stays on 32-bit values held in int64 with multipliers below 2**31, so no product
    overflows.
    """
    h = _hash32(seed & _MASK32)
    h = _hash32(h ^ ((seed >> 32) & _MASK32))
    h = _hash32(h ^ (step & _MASK32))
    h = _hash32(h ^ ((step >> 32) & _MASK32) ^ 0x5BD1E995)
    return (h >> 8).float() * (1.0 / (1 << 24))


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (Mueller's), on int64 tensors holding values below 2**32."""
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _MASK32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _MASK32
    return x ^ (x >> 16)
