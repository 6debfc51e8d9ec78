"""A draft model on its own paged KV cache: each step's verifying requests draft together in
batched decode steps of a smaller decoder (replayed from CUDA graphs on the GPU), so drafting
costs what a real draft model's decode steps cost.

Each request the drafter serves holds a *slot* of the draft model's KV tensor
(``executor.draft_forwards``) and the tokens whose KV it holds. A proposal of ``k`` drafts
from a history ``h`` (its last token last):

1. *catch-up*: the slot's tokens are cut to their common prefix with ``h`` (never all of it:
   the last token is fed again for its logits); a long remainder (a new request: its whole
   prompt) is prefilled, all but its last two tokens.
2. *drafting*: the batch's first forward and ``k - 1`` decode steps
   (``DraftForwards.decode_steps``), every verifying request at once; the drafts are read
   back once (``propose_batch``) or left on the device (``propose_on_device``).
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
(``num_steps``, ``num_two_token_steps`` and ``num_prefill_tokens`` are the forwards' counts,
``time_s`` times the proposals). Drafts are the draft model's argmax (a deterministic
drafter, as ``executor.verify`` assumes). Histories have at least two tokens (a verifying
request has emitted one).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from executor.draft_forwards import DraftForwards
from executor.drafter import Drafter
from executor.model import CausalLM
from horizon.step_buckets import GRAPH_BATCH_SIZES


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
        self.model, self.vocab_size = model, model.config.vocab_size
        self.forwards = DraftForwards(
            model, max_seqs, max_len, block_size, cuda_graphs, backend, graph_batch_sizes
        )
        self.device, self.max_seqs = self.forwards.device, max_seqs
        self._slots: dict[int, tuple[int, np.ndarray, int]] = {}  # rid: slot, tokens, verified
        self._free = list(range(max_seqs - 1, -1, -1))
        self.draft_ahead, self.on_device = bool(draft_ahead), bool(on_device)
        self._ahead: _Launch | None = None  # prefetch's, not yet taken
        self._issued: list[_Launch] = []  # handed over on the device, slots not yet told
        self._ready: dict[int, tuple[np.ndarray, int, np.ndarray]] = {}  # history, k, drafts
        self.num_ahead = self.num_calls = 0
        self.time_s = 0.0

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
        self.forwards.reset_counters()
        self.num_calls = self.num_ahead = 0
        self.time_s = 0.0

    @property
    def num_steps(self) -> int:
        return self.forwards.num_steps

    @property
    def num_two_token_steps(self) -> int:
        return self.forwards.num_two_token_steps

    @property
    def num_prefill_tokens(self) -> int:
        return self.forwards.num_prefill_tokens

    def capture_graphs(self, sizes: Sequence[int] | None = None) -> None:
        """The forwards' graphs of ``sizes`` (default: every bucket) captured now."""
        self.forwards.capture_graphs(sizes)

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
            if got is not None and _same(got[0], got[1], histories[i], ks[i]):
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
            if j is not None and _same(ahead.hs[j], ahead.k[j], histories[i], ks[i]):
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
            chunks = [hs[j][keep[j] : lens[j] - 2] for j in long]
            self.forwards.prefill(chunks, slots[long], keep[long])
            keep[long] = lens[long] - 2
        return _Launch(
            hs, rids, k, slots, lens, self.forwards.decode_steps(hs, slots, keep, lens, k)
        )

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


def _same(history: np.ndarray, k: int, want: np.ndarray, want_k: int) -> bool:
    """Drafts launched for ``history`` and ``k`` answer a proposal for ``want`` and ``want_k``."""
    return k == want_k and np.array_equal(history, want)
