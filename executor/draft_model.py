"""A draft model as a drafter: a smaller decoder proposes each verifying request's drafts by
greedy decoding from its history.

Reference implementation (CPU runs, tests; ``executor.paged_draft`` is the paged one whose
cost is a real draft model's, and proposes the same drafts): the draft model keeps one
contiguous cache per request (``executor.model.DenseKVCache``) and runs each step's verifying
requests together, first a ragged forward of every request's tokens not yet in its cache (the
whole prompt at its first verification, then the one or two tokens the target accepted since),
then ``k - 1`` one-token forwards of the drafts. Each cache remembers the tokens it holds; at
the next proposal it is cut to its common prefix with the request's accepted history, so
rejected drafts and preemptions need no notice (``forget`` drops a finished request's cache).
Not paged, not in the target's forward, not graph-captured: its cost is the dense reference
attention's, so figures from it are not the engine's speed.

Drafts are the draft model's argmax (a deterministic drafter): rejection sampling then treats
them as one-hot proposals (``executor.verify``), which keeps the target's distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from executor.drafter import Drafter
from executor.model import CausalLM, DenseKVCache
from executor.model.testing import forward_prompts


class DraftModelDrafter(Drafter):
    """Greedy drafts from ``model`` (a ``CausalLM`` sharing the target's vocabulary, or the
    name of one in ``executor.named_models``, loaded in ``dtype`` on ``device``)."""

    name = "draft_model"

    def __init__(self, model: CausalLM | str, dtype: str = "float32", device: str = "cpu") -> None:
        if isinstance(model, str):
            from executor.named_models import load_named

            model = load_named(model, dtype=dtype, device=device)[0]
        if not isinstance(model, CausalLM):
            raise ValueError(f"DraftModelDrafter.model must be a CausalLM or a name, got {model!r}")
        self.model = model
        self.vocab_size = model.config.vocab_size
        self._caches: dict[int, tuple[DenseKVCache, list[int]]] = {}

    def forget(self, request_id: int) -> None:
        self._caches.pop(request_id, None)

    @torch.no_grad()
    def propose_batch(
        self, histories: Sequence[np.ndarray], ks: Sequence[int], request_ids: Sequence[int]
    ) -> list[np.ndarray]:
        live = [i for i, k in enumerate(ks) if k > 0]
        out = [np.zeros(0, dtype=np.int64) for _ in ks]
        if not live:
            return out
        caches, chunks = [], []
        for i in live:
            cache, held = self._cache_for(request_ids[i], histories[i])
            caches.append(cache)
            chunks.append(histories[i][len(held) :].tolist())
            held.extend(chunks[-1])
        logits = forward_prompts(self.model, chunks, caches)
        last = np.cumsum([len(c) for c in chunks]) - 1
        drafts = {i: [int(t)] for i, t in zip(live, logits[last].argmax(-1).tolist())}
        for step in range(1, max(ks[i] for i in live)):
            more = [j for j, i in enumerate(live) if ks[i] > step]
            feed = [[drafts[live[j]][-1]] for j in more]
            logits = forward_prompts(self.model, feed, [caches[j] for j in more])
            for j, t in zip(more, logits.argmax(-1).tolist()):
                i = live[j]
                self._caches[request_ids[i]][1].append(drafts[i][-1])
                drafts[i].append(int(t))
        for i in live:
            out[i] = np.array(drafts[i], dtype=np.int64)
        return out

    def _cache_for(self, rid: int, history: np.ndarray) -> tuple[DenseKVCache, list[int]]:
        """``rid``'s cache cut to its common prefix with ``history`` (never all of it: the last
        token is fed again for its logits) and the tokens it holds."""
        entry = self._caches.get(rid)
        if entry is None:
            entry = self._caches[rid] = (DenseKVCache(self.model.config.num_layers), [])
        cache, held = entry
        n = min(len(held), len(history) - 1)
        same = np.flatnonzero(np.asarray(held[:n]) != history[:n])
        keep = int(same[0]) if len(same) else n
        if keep < len(held):
            del held[keep:]
            for layer, (k, v) in enumerate(zip(cache.keys, cache.values)):
                if k is not None and v is not None:
                    cache.keys[layer], cache.values[layer] = k[:keep], v[:keep]
        return entry
