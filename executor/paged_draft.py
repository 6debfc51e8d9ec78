"""A draft model on its own paged KV cache: each step's verifying requests draft together in
batched decode steps of a smaller decoder (replayed from CUDA graphs on the GPU), so drafting
costs what a real draft model's decode steps cost.

Each request the drafter serves holds a *slot*: a fixed run of ``ceil(max_len / block_size)``
blocks of the draft model's KV tensor (slot ``s``'s token at position ``p`` lives at slot
mapping ``s * max_len_blocks * block_size + p``), and the tokens whose KV it holds. A proposal
of ``k`` drafts from a history ``h`` (its last token last):

1. *catch-up*: the slot's tokens are cut to their common prefix with ``h`` (never all of it:
   the last token is fed again for its logits). A long remainder (a new request: its whole
   prompt) is computed by one eager ragged forward, all but its last two tokens. The rest is
   one token after a rejection, two when every draft was accepted (the last draft and the
   target's token): one *first forward* of the batch takes each request's last token (a
   decode step) or, when some request has two, each request's last two (a ragged step of two
   tokens a request, a request with one re-computing the KV of the token before its last).
   Its argmax is draft 1.
2. *drafting*: ``k - 1`` decode steps feed each draft to get the next. Every step runs every
   verifying request at once (a request with fewer drafts to make rides along as a padding
   row: slot ``-1``, context 0), padded to a graph bucket, inputs chained on the device; the
   drafts are read back once.

3. *drafting ahead* (``prefetch``): the runner launches the next step's proposals as soon as
   a verification's tokens are committed, for the requests that go on with the same ``k``
   (EAGLE's and vLLM's place for drafting: at the end of the step that verified), and the
   scheduler's update and plan run on the host while the device drafts. The next plan's
   ``propose_batch`` reads back those whose history and ``k`` match and proposes the rest
   afresh (``num_ahead`` counts the drafts taken ahead). Either way a draft is the model's
   argmax after the same history; a proposal made afresh after a launch ahead may run in
   another batch or catch-up path than it would have, so where two logits nearly tie the
   argmax may differ by rounding, as between any two batchings of the same requests.

So a proposal costs ``k`` forwards of the batch, as a draft model in a paged engine takes
(``num_steps`` counts them, ``num_two_token_steps`` the two-token first forwards, ``time_s``
times the proposals, ``num_prefill_tokens`` counts the eager prefills' tokens). Drafts are the
draft model's argmax (a deterministic drafter, as ``executor.verify`` assumes). Histories have
at least two tokens (a verifying request has emitted one).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from executor.attention import PagedAttention
from executor.drafter import Drafter
from executor.kernels import allocate_kv_cache
from executor.kernels.tiling import decode_num_splits
from executor.model import CausalLM
from horizon.step_buckets import GRAPH_BATCH_SIZES, bucket_of, decode_buckets


def draft_model_of(
    name: str, dtype: str, device: str, seed: int = 0, vocab_size: int | None = None
) -> CausalLM:
    """A preset shape (``executor.model.config``, e.g. ``qwen2.5-0.5b``) with seeded random
    weights (its drafts mean nothing: for stated acceptance, where only its cost counts).

    ``vocab_size``: the target's, where the pair shares a tokenizer but pads its embedding
    rows differently (Qwen2.5-0.5B 151,936 rows, 7B 152,064, both over the same 151,665-token
    tokenizer): a random-weight target emits ids in its padding that the draft must read."""
    from executor.bench import device_random_weights
    from executor.model import ModelConfig

    config = ModelConfig.for_preset(name)
    if vocab_size is not None:
        config = dataclasses.replace(
            config, shape=dataclasses.replace(config.shape, vocab_size=vocab_size)
        )
    model = CausalLM(config, device=device, dtype=getattr(torch, dtype))
    device_random_weights(model, seed)
    return model.eval()


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


@dataclasses.dataclass
class _Launch:
    """Proposals queued on the device: histories, request ids, ``k`` each, slots, histories'
    lengths, the ``[max k, bucket]`` drafts, and the requests whose slots were since caught up
    by another launch (``skip``: their slots keep that one's state)."""

    hs: list[np.ndarray]
    rids: list[int]
    k: np.ndarray
    slots: np.ndarray
    lens: np.ndarray
    dev: torch.Tensor
    skip: set[int] = dataclasses.field(default_factory=set)


class PagedDraftModelDrafter(Drafter):
    """Greedy drafts from ``model`` (a ``CausalLM`` whose vocabulary fits the target's, or a
    preset name: random weights, ``draft_model_of``) on a paged KV cache of ``max_seqs`` slots
    of ``max_len`` tokens.

    Args:
        max_seqs: most requests with a slot at once (the target's ``max_num_seqs``); a slot
            of a request not in the current step is taken back when they run out.
        max_len: most tokens of a request (the target's ``max_model_len``).
        cuda_graphs: replay decode steps from graphs (default: on CUDA with Triton).
        backend: attention kernels (default: triton on CUDA, torch on CPU).
        draft_ahead: honour ``prefetch`` (the runner's call right after a verification): the
            next proposals' forwards run on the device while the host plans the next step.
        on_device: honour ``propose_on_device`` (the drafts stay on the device while the
            runner stages the verification; read back with it).
    """

    name = "paged_draft_model"

    def __init__(
        self,
        model: CausalLM | str,
        max_seqs: int,
        max_len: int,
        block_size: int = 16,
        cuda_graphs: bool | None = None,
        backend: str | None = None,
        dtype: str = "bfloat16",
        device: str = "cuda",
        seed: int = 0,
        graph_batch_sizes: Sequence[int] = GRAPH_BATCH_SIZES,
        draft_ahead: bool = True,
        on_device: bool = True,
    ) -> None:
        from executor.draft_head import DraftHead

        if isinstance(model, str):
            model = draft_model_of(model, dtype, device, seed)
        if not isinstance(model, (CausalLM, DraftHead)):
            raise ValueError(
                "PagedDraftModelDrafter.model must be a CausalLM, a DraftHead or a preset name, "
                f"got {model!r}"
            )
        for field, v in (("max_seqs", max_seqs), ("max_len", max_len), ("block_size", block_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"PagedDraftModelDrafter.{field} must be an int >= 1, got {v!r}")
        self.model, c = model, model.config
        self.vocab_size = c.vocab_size
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
        self._slots: dict[int, tuple[int, np.ndarray, int]] = {}  # rid: slot, tokens, verified
        self._free = list(range(max_seqs - 1, -1, -1))
        self.draft_ahead, self.on_device = bool(draft_ahead), bool(on_device)
        self._ahead: _Launch | None = None  # prefetch's, not yet taken
        self._issued: list[_Launch] = []  # handed over on the device, slots not yet told
        self._ready: dict[int, tuple[np.ndarray, int, np.ndarray]] = {}  # history, k, drafts
        self.num_ahead = 0
        self.num_calls = self.num_steps = self.num_prefill_tokens = self.num_two_token_steps = 0
        self.time_s = 0.0

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

    # -- requests --------------------------------------------------------------------------------
    def forget(self, request_id: int) -> None:
        for launch in (self._ahead, *self._issued):  # launches in flight leave its slot be
            if launch is not None:
                launch.skip.add(request_id)
        self._issued = [x for x in self._issued if not x.skip.issuperset(x.rids)]
        if self._ahead is not None and self._ahead.skip.issuperset(self._ahead.rids):
            self._ahead = None
        self._ready.pop(request_id, None)
        entry = self._slots.pop(request_id, None)
        if entry is not None:
            self._free.append(entry[0])

    def check_integrity(self) -> None:
        """Every slot is free or held by one request, launches in flight name only requests
        that hold one (or are skipped), and drafts ready to take are of held requests."""
        held = [slot for slot, _, _ in self._slots.values()]
        assert len(set(held)) == len(held), "a slot held by two requests"
        assert sorted(held + self._free) == list(range(self.max_seqs)), "slots lost or doubled"
        for launch in (self._ahead, *self._issued):
            if launch is not None:
                live = set(launch.rids) - launch.skip
                assert live <= self._slots.keys(), "a launch in flight for a request without a slot"
        assert self._ready.keys() <= self._slots.keys(), "drafts ready for a request without a slot"

    def reset_counters(self) -> None:
        self.num_calls = self.num_steps = self.num_prefill_tokens = self.num_two_token_steps = 0
        self.num_ahead, self.time_s = 0, 0.0

    def _claim(self, rid: int, history: np.ndarray, busy: set[int]) -> tuple[int, int]:
        """``rid``'s slot and how many of ``history``'s tokens it holds (its tokens cut to
        their common prefix with ``history``, the last token excluded)."""
        entry = self._slots.pop(rid, None)
        if entry is None:
            if not self._free:
                victim = next((r for r in self._slots if r not in busy), None)
                if victim is None:
                    raise RuntimeError(
                        f"PagedDraftModelDrafter: more than max_seqs={self.max_seqs} requests "
                        "in a step"
                    )
                self.forget(victim)
            entry = (self._free.pop(), history[:0], 0)
        slot, held, verified = entry
        n = min(len(held), len(history) - 1)
        verified = min(verified, n)  # held[:verified] came from an accepted history
        diff = np.flatnonzero(held[verified:n] != history[verified:n])
        keep = verified + int(diff[0]) if len(diff) else n
        self._slots[rid] = (slot, held[:keep], keep)  # re-inserted: most recently used last
        return slot, keep

    # -- proposals -------------------------------------------------------------------------------
    @torch.no_grad()
    def propose_batch(
        self, histories: Sequence[np.ndarray], ks: Sequence[int], request_ids: Sequence[int]
    ) -> list[np.ndarray]:
        out = [np.zeros(0, dtype=np.int64) for _ in ks]
        live = [i for i, k in enumerate(ks) if k > 0]
        if not live:
            return out
        t0 = time.perf_counter()
        self._settle()
        ready, self._ready = self._ready, {}
        todo = []
        for i in live:  # drafts launched ahead for this very history and k: taken as they are
            got = ready.get(request_ids[i])
            if got is not None and got[1] == ks[i] and np.array_equal(got[0], histories[i]):
                out[i] = got[2]
                self.num_ahead += 1
            else:
                todo.append(i)
        if todo:
            busy = {request_ids[i] for i in live}
            launch = self._launch([histories[i] for i in todo], todo, ks, request_ids, busy)
            for i, d in zip(todo, self._commit(launch)):
                out[i] = d
        self.num_calls += 1
        self.time_s += time.perf_counter() - t0
        return out

    @torch.no_grad()
    def propose_on_device(
        self, histories: Sequence[np.ndarray], ks: Sequence[int], request_ids: Sequence[int]
    ) -> torch.Tensor | None:
        """``propose_batch``'s drafts left on the device, so that the runner stages the
        verification while they are made: an int32 ``[max k, >= n]`` tensor whose column ``i``
        holds request ``i``'s ``ks[i]`` drafts, every one proposed (None where some ``k`` is 0:
        ``propose_batch`` then). Drafts launched ahead for an equal history and ``k`` are
        taken; the slots learn their drafts at the next call."""
        if not self.on_device or not ks or min(ks) <= 0:
            return None
        t0 = time.perf_counter()
        self._settle_issued()
        self._ready = {}
        ahead, self._ahead = self._ahead, None
        cols, todo = np.arange(len(ks), dtype=np.int64), []
        where = {} if ahead is None else {rid: j for j, rid in enumerate(ahead.rids)}
        for i, rid in enumerate(request_ids):
            j = where.get(rid)
            if j is not None and ahead.k[j] == ks[i] and np.array_equal(ahead.hs[j], histories[i]):
                cols[i] = j
            else:
                todo.append(i)
                if j is not None:
                    ahead.skip.add(rid)  # its slot is caught up afresh below
        parts = [] if ahead is None else [ahead]
        self._issued += parts  # before the launch below: a slot it takes back is skipped there
        if todo:
            launch = self._launch(
                [histories[i] for i in todo], todo, ks, request_ids, set(request_ids)
            )
            cols[todo] = np.arange(len(todo)) + (0 if ahead is None else ahead.dev.shape[1])
            parts.append(launch)
            self._issued.append(launch)
        self.num_ahead += len(ks) - len(todo)
        self.num_calls += 1
        self.time_s += time.perf_counter() - t0
        if len(parts) == 1 and np.array_equal(cols, np.arange(len(ks))):
            return parts[0].dev
        kmax = max(x.dev.shape[0] for x in parts)
        wide = torch.cat([F.pad(x.dev, (0, 0, 0, kmax - x.dev.shape[0])) for x in parts], dim=1)
        return wide.index_select(1, torch.from_numpy(cols).to(self.device, non_blocking=True))

    @torch.no_grad()
    def prefetch(
        self, histories: Sequence[np.ndarray], ks: Sequence[int], request_ids: Sequence[int]
    ) -> None:
        """Launch the proposals of ``histories`` now (``draft_ahead``), their drafts left on
        the device while the host plans the next step; a proposal of a request with an equal
        history and ``k`` takes them, any other proposes afresh."""
        self._settle()
        live = [i for i, k in enumerate(ks) if k > 0]
        if not self.draft_ahead or not live:
            return
        t0 = time.perf_counter()
        hs = [np.array(histories[i], dtype=np.int64) for i in live]  # copies: the runner's rows
        self._ahead = self._launch(hs, live, ks, request_ids, {request_ids[i] for i in live})
        self.time_s += time.perf_counter() - t0

    def _settle_issued(self) -> None:
        """The slots of proposals handed over on the device learn their drafts."""
        issued, self._issued = self._issued, []
        for launch in issued:
            self._commit(launch)

    def _settle(self) -> None:
        """As ``_settle_issued``; drafts launched ahead and not taken are read back and kept
        by request, for ``propose_batch``."""
        self._settle_issued()
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            drafts, self._ready = self._commit(ahead), {}
            for rid, h, n, d in zip(ahead.rids, ahead.hs, ahead.k, drafts):
                if rid not in ahead.skip:
                    self._ready[rid] = (h, int(n), d)

    def _launch(self, hs, idx, ks, request_ids, busy) -> _Launch:  # noqa: ANN001
        """Queue the proposals of histories ``hs`` (requests ``idx`` of ``ks`` and
        ``request_ids``) on the device: each request's slot and catch-up, then its decode
        steps."""
        hs = [np.asarray(h, dtype=np.int64) for h in hs]
        rids = [request_ids[i] for i in idx]
        k = np.array([ks[i] for i in idx], dtype=np.int64)
        claimed = [self._claim(rid, h, busy) for rid, h in zip(rids, hs)]
        slots = np.array([s for s, _ in claimed], dtype=np.int64)
        keep = np.array([n for _, n in claimed], dtype=np.int64)
        lens = np.array([len(h) for h in hs], dtype=np.int64)
        if lens.min() < 2:
            raise ValueError("PagedDraftModelDrafter: a history of fewer than 2 tokens")
        long = np.flatnonzero(lens - keep > 2)
        if len(long):  # all but the last two tokens of long remainders: one ragged forward
            self._prefill([hs[j][keep[j] : lens[j] - 2] for j in long], slots[long], keep[long])
            keep[long] = lens[long] - 2
        return _Launch(hs, rids, k, slots, lens, self._decode_steps(hs, slots, keep, lens, k))

    def _commit(self, launch: _Launch) -> list[np.ndarray]:
        """Read a launch's drafts back; each slot (but those ``skip``ped: caught up again
        since) now holds its history and all but its last draft."""
        drafts = launch.dev.cpu().numpy().T[: len(launch.hs)].astype(np.int64)
        out = []
        for j, rid in enumerate(launch.rids):
            k = launch.k[j]
            d = drafts[j, :k].copy()
            if rid not in launch.skip:
                fed = np.concatenate([launch.hs[j], d[: k - 1]])
                self._slots[rid] = (int(launch.slots[j]), fed, int(launch.lens[j]))
            out.append(d)
        return out

    def _prefill(self, chunks: list[np.ndarray], slots: np.ndarray, starts: np.ndarray) -> None:
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

    def _decode_steps(self, hs, slots, keep, lens, k) -> torch.Tensor:  # noqa: ANN001
        """``[max k, bucket]`` drafts on the device (row ``j``'s in column ``j``): a first
        forward of each row's last token (one decode step) or, when some row has two tokens to
        catch up, of each row's last two tokens (one ragged step of two tokens a row: a row
        with one re-computes the KV of the token before its last, which its slot holds
        already); then ``max k - 1`` decode steps, step ``s`` feeding row ``j`` its draft
        ``s`` at position ``lens[j] - 1 + s``."""
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
