"""Verifying draft tokens: the target's judgement on the device, the accepted tokens on the host.

A verifying request's query is ``x_0 d_1 ... d_m`` (its last token and ``m`` drafts) at
positions ``C .. C + m``; the logits at query index ``i`` are the target's distribution ``p_i``
of the token after it. ``judge`` gives, for every query row ``i``:

* ``accept[i]``: whether draft ``d_{i+1}`` is accepted given ``d_1..d_i`` were (always false at
  the last row, ``i = m``, which has no draft after it);
* ``alt[i]``: the token emitted at ``i`` if ``d_{i+1}`` is rejected (or at the bonus row).

Greedy rows: ``alt = argmax p_i`` and ``accept = (alt == d_{i+1})``, so the emitted tokens are
exactly what plain greedy decoding emits. Sampled rows (temperature > 0), rejection sampling
(Leviathan et al. 2023) with a deterministic drafter, whose draft distribution ``q`` is one-hot:
accept ``d`` with probability ``min(1, p(d) / q(d)) = p(d)``; on rejection draw from
``norm(max(0, p - q))``, which is ``p`` with ``d`` removed, renormalised; the bonus row draws
from ``p``. Each emitted token is then distributed as ``p`` (filtered as ``executor.sampling``
filters it). Randomness is ``executor.sampling.uniform``'s: row ``i`` of a request whose
generated count is ``g`` uses step ``g + i``, the acceptance test its own stream (step offset
``ACCEPT_STREAM``), so a verification is a pure function of the seed, the history and the
logits.

``resolve`` walks each request's rows on the host: the first rejected index ``a`` gives
``d_1..d_a`` plus ``alt[a]`` (``a + 1`` tokens), cut to the request's emit limit and after a
stop token.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import torch

from executor.sampling import SamplingBatch, _invert_cdf, filtered_logits, uniform

ACCEPT_STREAM = 1 << 40  # the acceptance tests' uniforms: steps offset by this


def judge(
    logits: torch.Tensor, next_draft: torch.Tensor, batch: SamplingBatch | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(accept, alt)`` int32 ``[N]`` for ``N`` query rows (see the module docstring).

    Args:
        logits: ``[N, vocab]`` fp32 target logits of the verifying requests' query rows.
        next_draft: ``[N]`` int64, the draft after each row (``-1``: none, the bonus row).
        batch: per-row sampling parameters (steps ``g + i``); None: every row greedy.
    """
    if batch is not None and batch.suppress is not None:
        logits = logits.index_put(batch.suppress, torch.tensor(float("-inf"), device=logits.device))
    greedy = logits.argmax(dim=-1)
    accept = greedy == next_draft
    if batch is None or batch.all_greedy:
        return accept.to(torch.int32), greedy.to(torch.int32)
    probs = torch.softmax(filtered_logits(logits, batch), dim=-1)
    has = next_draft >= 0
    d = next_draft.clamp(min=0)[:, None]
    p_draft = probs.gather(1, d).squeeze(1)
    u_accept = uniform(batch.seed, batch.step + ACCEPT_STREAM)
    accept_s = has & (u_accept < p_draft)
    residual = torch.where(has[:, None], probs.scatter(1, d, 0.0), probs)
    alt_s = _invert_cdf(residual, uniform(batch.seed, batch.step))
    sampled = batch.temperature > 0
    accept = torch.where(sampled, accept_s, accept)
    alt = torch.where(sampled, alt_s, greedy)
    return accept.to(torch.int32), alt.to(torch.int32)


def next_drafts(drafts: Sequence[np.ndarray]) -> np.ndarray:
    """Each query row's following draft (``-1`` at each request's last row), in row order."""
    q = np.array([len(d) + 1 for d in drafts], dtype=np.int64)
    out = np.full(int(q.sum()), -1, dtype=np.int64)
    has = np.ones(len(out), dtype=bool)
    has[np.cumsum(q) - 1] = False
    if has.any():
        out[has] = np.concatenate(drafts)
    return out


def resolve(
    accept: np.ndarray,
    alt: np.ndarray,
    drafts: Sequence[np.ndarray],
    limits: Sequence[int],
    stop_ids: Collection[int] = (),
    next_draft: np.ndarray | None = None,
) -> list[list[int]]:
    """The tokens each verifying request emits (1 or more each), from ``judge``'s rows read
    back: accepted drafts plus one, at most ``limits[j]`` of them, ending at the first of
    ``stop_ids`` if one comes earlier. ``next_draft``: ``next_drafts(drafts)`` if at hand."""
    q = np.array([len(d) + 1 for d in drafts], dtype=np.int64)
    starts = np.cumsum(q) - q
    rejected = np.flatnonzero(accept[: int(q.sum())] == 0)  # each request's last row is one
    first = rejected[np.searchsorted(rejected, starts)]
    # row i emits its next draft while before its request's first rejection, then its alt
    rows = np.arange(int(q.sum()))
    nxt = next_drafts(drafts) if next_draft is None else next_draft
    vals = np.where(rows < np.repeat(first, q), nxt, alt[: len(rows)])
    ends = starts + np.minimum(first - starts + 1, np.maximum(np.asarray(limits), 1))
    out = [vals[a:b].tolist() for a, b in zip(starts.tolist(), ends.tolist())]
    if stop_ids:
        for j, tokens in enumerate(out):
            for i, t in enumerate(tokens):
                if t in stop_ids:
                    out[j] = tokens[: i + 1]
                    break
    return out
