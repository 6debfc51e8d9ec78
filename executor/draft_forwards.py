"""A draft model's batched forwards on its own paged KV cache: the pieces of a proposal.

The KV tensor holds ``max_seqs`` *slots* of ``ceil(max_len / block_size)`` blocks each (slot
``s``'s token at position ``p`` lives at slot mapping ``s * slot_blocks * block_size + p``).
For a batch of requests, each in its slot, ``decode_steps`` runs a proposal's forwards:

1. a *first forward* of the batch takes each request's last token (a decode step) or, when
   some request has two to catch up (every draft accepted: the last draft and the target's
   token), each request's last two (a ragged step of two tokens a request, a request with one
   re-computing the KV of the token before its last). Its argmax is draft 1.
2. ``k - 1`` decode steps feed each draft to get the next. Every step runs every request at
   once (a request with fewer drafts to make rides along as a padding row: slot ``-1``,
   context 0), padded to a graph bucket (``buckets``), inputs chained on the device.

``prefill`` computes a long catch-up (a new request's prompt) in one eager ragged forward.
Decode and two-token steps replay CUDA graphs (captured up front by ``capture_graphs``, or on
first use with the step's inputs kept across the capture). ``num_steps`` counts the decode
forwards, ``num_two_token_steps`` the two-token first forwards, ``num_prefill_tokens`` the
eager prefills' tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from executor.attention import PagedAttention
from executor.kernels import allocate_kv_cache
from executor.kernels.tiling import decode_num_splits
from horizon.step_buckets import GRAPH_BATCH_SIZES, bucket_of, decode_buckets


def _forward_of(model, backend: str):  # noqa: ANN001, ANN202 - a CausalLM or DraftHead; a callable
    """``model``'s forward on ``backend``: a draft head picks its kernels itself, a
    ``CausalLM`` on Triton runs ``executor.fused``'s."""
    from executor.draft_head import DraftHead

    if isinstance(model, DraftHead):
        return functools.partial(model.forward, kernels=backend)
    if backend == "triton":
        from executor.fused import FusedForward

        return FusedForward(model)
    return model


class DraftForwards:
    """``model``'s (a ``CausalLM`` or a ``DraftHead``) forwards over ``max_seqs`` slots of
    ``max_len`` tokens (see the module docstring); ``cuda_graphs`` and ``backend`` as
    ``PagedDraftModelDrafter``'s."""

    def __init__(
        self,
        model,  # noqa: ANN001 - a CausalLM or a DraftHead
        max_seqs: int,
        max_len: int,
        block_size: int = 16,
        cuda_graphs: bool | None = None,
        backend: str | None = None,
        graph_batch_sizes: Sequence[int] = GRAPH_BATCH_SIZES,
    ) -> None:
        self.model, c = model, model.config
        self.device = dev = model.embed_tokens.weight.device
        self.backend = backend or ("triton" if dev.type == "cuda" else "torch")
        on_triton = dev.type == "cuda" and self.backend == "triton"
        self.cuda_graphs = on_triton if cuda_graphs is None else cuda_graphs
        self.max_seqs, self.max_len, self.block_size = max_seqs, max_len, block_size
        self.slot_blocks = -(-max_len // block_size)
        kv = allocate_kv_cache(
            c.num_layers, max_seqs * self.slot_blocks, block_size, c.num_kv_heads, c.head_dim,
            model.embed_tokens.weight.dtype, dev,
        )  # fmt: skip
        self.attention = PagedAttention(kv, c.attention_scale, self.backend)
        # a draft head (executor.draft_head) prices its fusion layer before a proposal's first
        # forward and a prefill
        self._begin = getattr(model, "begin_proposal", None)
        self._forward = _forward_of(model, self.backend)
        self.buckets = decode_buckets(max_seqs, graph_batch_sizes)
        self._init_buffers(self.buckets[-1])
        self._graphs: dict[tuple[str, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None
        self.reset_counters()

    def reset_counters(self) -> None:
        self.num_steps = self.num_prefill_tokens = self.num_two_token_steps = 0

    def _init_buffers(self, nb: int) -> None:
        """The static inputs of the steps' graphs, for up to ``nb`` rows."""
        dev = self.device
        self._buf = {
            n: torch.zeros(nb, dtype=torch.int32, device=dev) for n in ("ids", "pos", "slot", "ctx")
        }
        self._bt = torch.zeros((nb, self.slot_blocks), dtype=torch.int32, device=dev)
        self._pair_buf = {  # the two-token first forward's: ids, pos, slot rows; ctx; cu
            "tok": torch.zeros((3, 2 * nb), dtype=torch.int32, device=dev),
            "ctx": torch.full((nb,), 2, dtype=torch.int32, device=dev),
            "cu": torch.arange(0, 2 * nb + 1, 2, dtype=torch.int32, device=dev),
        }

    def prefill(self, chunks: list[np.ndarray], slots: np.ndarray, starts: np.ndarray) -> None:
        """KV of each ``chunks[j]`` at positions ``starts[j]..`` of slot ``slots[j]`` (eager)."""
        q = np.array([len(c) for c in chunks], dtype=np.int64)
        pos = np.repeat(starts, q) + np.arange(int(q.sum())) - np.repeat(np.cumsum(q) - q, q)
        span = self.slot_blocks * self.block_size
        dev, i32 = self.device, torch.int32

        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(
                device=dev, dtype=i32, non_blocking=True
            )

        cu = np.concatenate([[0], np.cumsum(q)])
        self.attention.set_step(
            t(np.repeat(slots, q) * span + pos), t(self._tables(slots)), t(starts + q), t(cu)
        )
        if self._begin is not None:
            self._begin(int(q.sum()))
        self._forward(t(np.concatenate(chunks)), t(pos), self.attention)
        self.num_prefill_tokens += int(q.sum())

    def _tables(self, slots: np.ndarray) -> np.ndarray:
        return slots[:, None] * self.slot_blocks + np.arange(self.slot_blocks)[None, :]

    def decode_steps(self, hs, slots, keep, lens, k) -> torch.Tensor:  # noqa: ANN001
        """``[max k, bucket]`` drafts on the device (row ``j``'s in column ``j``) of histories
        ``hs`` in ``slots``, whose KV holds ``keep`` tokens each (``lens - keep`` is 1 or 2):
        the first forward, then ``max k - 1`` decode steps, step ``s`` feeding row ``j`` its
        draft ``s`` at position ``lens[j] - 1 + s``."""
        n, kmax = len(hs), int(k.max())
        b = bucket_of(n, self.buckets) if self.cuda_graphs else n
        span = self.slot_blocks * self.block_size
        s = np.arange(kmax)[None, :]
        pos = lens[:, None] - 1 + s
        active = s < k[:, None]
        meta = np.zeros((4, kmax, b), dtype=np.int32)  # ids, pos, slot, ctx per step and row
        meta[0, 0, :n] = [h[-1] for h in hs]
        meta[1, :, :n] = np.where(active, pos, 0).T
        meta[2, :, :n] = np.where(active, slots[:, None] * span + pos, -1).T
        meta[2, :, n:] = -1
        meta[3, :, :n] = np.where(active, pos + 1, 0).T
        tables = np.zeros((b, self.slot_blocks), dtype=np.int32)
        tables[:n] = self._tables(slots)
        self._bt[:b].copy_(torch.from_numpy(tables), non_blocking=True)
        meta_dev = torch.from_numpy(meta).to(self.device, non_blocking=True)
        drafts = torch.empty((kmax, b), dtype=torch.int32, device=self.device)
        buf = self._buf
        pair = int((lens - keep).max()) > 1
        if self._begin is not None:
            self._begin(2 * b if pair else b)
        if pair:
            tokens = self._pair_step(hs, slots, lens, b)
            self.num_two_token_steps += 1
        else:
            buf["ids"][:b].copy_(meta_dev[0, 0])
        for st in range(kmax):
            if st:
                buf["ids"][:b].copy_(tokens)
            if st or not pair:
                for i, name in enumerate(("pos", "slot", "ctx"), start=1):
                    buf[name][:b].copy_(meta_dev[i, st])
                tokens = self._step(b)
            drafts[st].copy_(tokens)
        self.num_steps += kmax
        return drafts

    def _pair_step(self, hs, slots, lens, b: int) -> torch.Tensor:  # noqa: ANN001
        """The first forward of two tokens a row (positions ``lens - 2``, ``lens - 1``); padding
        rows: slots -1, context 2 over block 0 (read, never written). Each row's argmax."""
        n, span = len(hs), self.slot_blocks * self.block_size
        meta = np.zeros((3, 2 * b), dtype=np.int32)  # ids, pos, slot per token
        pos = np.stack([lens - 2, lens - 1], axis=1).reshape(-1)
        meta[0, : 2 * n] = np.concatenate([h[-2:] for h in hs])
        meta[1, : 2 * n] = pos
        meta[2, : 2 * n] = np.repeat(slots, 2) * span + pos
        meta[2, 2 * n :] = -1
        ctx = np.full(b, 2, dtype=np.int32)
        ctx[:n] = lens
        p = self._pair_buf
        p["tok"][:, : 2 * b].copy_(torch.from_numpy(meta), non_blocking=True)
        p["ctx"][:b].copy_(torch.from_numpy(ctx), non_blocking=True)
        return self._run(("pair", b))

    # -- decode steps and their graphs ------------------------------------------------------------
    def _decode_forward(self, b: int) -> torch.Tensor:
        """One decode step of ``b`` rows on the static buffers: each row's argmax (int32)."""
        buf, att = self._buf, self.attention
        splits = decode_num_splits(b, att.num_kv_heads, self.max_len, self.device)
        att.set_step(buf["slot"][:b], self._bt[:b], buf["ctx"][:b], None, splits)
        hidden = self._forward(buf["ids"][:b], buf["pos"][:b], att)
        return self.model.greedy_tokens(hidden)

    def _pair_forward(self, b: int) -> torch.Tensor:
        """The two-token first forward of ``b`` rows on its static buffers: the argmax of
        each row's second token."""
        p, att = self._pair_buf, self.attention
        tok = p["tok"]
        att.set_step(tok[2, : 2 * b], self._bt[:b], p["ctx"][:b], p["cu"][: b + 1])
        hidden = self._forward(tok[0, : 2 * b], tok[1, : 2 * b], att)
        return self.model.greedy_tokens(hidden, slice(1, None, 2))

    def _step(self, b: int) -> torch.Tensor:
        return self._run(("decode", b))

    def _run(self, key: tuple[str, int]) -> torch.Tensor:
        """A decode step (``("decode", b)``) or a first forward of two tokens a row
        (``("pair", b)``), replayed from its graph (captured on first use) or eager."""
        kind, b = key
        if not self.cuda_graphs:
            return self._decode_forward(b) if kind == "decode" else self._pair_forward(b)
        if key not in self._graphs:  # captured mid-proposal: the step's inputs kept across
            live = self._live_inputs()
            saved = [t.clone() for t in live]
            self._capture(key)
            for t, s in zip(live, saved):
                t.copy_(s)
        graph, tokens = self._graphs[key]
        graph.replay()
        return tokens

    def _live_inputs(self) -> list[torch.Tensor]:
        """The tensors a step's graph reads that hold the step's inputs (a capture overwrites
        them with padding rows): the static buffers and the model's ``graph_state()``."""
        state = getattr(self.model, "graph_state", None)
        extra = state() if state is not None else []
        return [*self._buf.values(), *self._pair_buf.values(), self._bt, *extra]

    @torch.no_grad()
    def capture_graphs(self, sizes: Sequence[int] | None = None) -> None:
        """Capture the decode and two-token graphs of ``sizes`` (default: every bucket),
        largest first; else each is captured on first use."""
        if self.cuda_graphs:
            for b in sorted(sizes or self.buckets, reverse=True):
                for kind in ("decode", "pair"):
                    if (kind, b) not in self._graphs:
                        self._capture((kind, b))

    def _capture(self, key: tuple[str, int]) -> None:
        """Capture on padding rows (slot -1: no KV written; context 0, or 2 over block 0 for a
        two-token forward); a step's inputs are later copied into the same buffers."""
        kind, b = key
        self._buf["slot"][:b].fill_(-1)
        self._buf["ctx"][:b].zero_()
        self._pair_buf["tok"][2].fill_(-1)
        self._pair_buf["ctx"].fill_(2)
        forward = self._decode_forward if kind == "decode" else self._pair_forward
        forward(b)  # compiles the kernels outside the capture
        torch.cuda.synchronize(self.device)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            tokens = forward(b)
        torch.cuda.synchronize(self.device)
        self._graphs[key] = (graph, tokens)
