"""The model runner: a ``StepPlan`` -> one forward pass of the paged model -> one token for each
request that emits in the step.

A step's flat batch, built on the host and sent with ONE host-to-device copy (from one of two
pinned buffers, used in turn)::

    tokens      | decode 0 | ... | decode d-1 | chunk 0 (n_0 tokens) | ... | chunk p-1 |
    sequences   |    0     | ... |    d-1     |          d           | ... |  d+p-1    |
    logits      one row per decode, one per chunk that ends its prefill (it emits a token)

The copy fills views of one persistent int32 device buffer (token ids, positions, slot mapping,
context lengths, ``cu_q_lens``, block-table rows, logit rows, block-table updates), so a
decode-only step replays a CUDA graph captured on those same views, padded to a bucketed batch
size with rows of slot ``-1`` and context 0 (which the kernels skip).

A step with prefill chunks ("mixed") replays a graph too, keyed by its token count rounded up to
a bucket (``mixed_token_buckets``): the flat batch is padded with tokens of slot ``-1`` that
belong to a padding sequence, and the sequences to ``max_num_seqs + 1`` with padding ones
(context 0: zeros), so the ragged kernel's grid (a function of those two sizes) is fixed. The
graph ends at the final hidden states; the logits of the step's emitting rows are computed
after it. Eagerly, such a step costs the host ~10 launches per layer (7-8 ms on a 24-layer model
whatever its size); replayed, what the GPU takes.

A step of decodes and verifications only (speculative decoding's steady state; ``verify_as_decode``)
is an expanded decode step: a verification of ``m`` drafts from position ``C`` is ``m + 1`` decode
rows, row ``i`` at position ``C + i`` with context ``C + i + 1`` over its request's block-table
row; every row's K/V is written before attention, so the split-K decode kernel is exact. Rows are
padded to ``verify_buckets`` (decode buckets, then mixed token buckets, up to the token budget)
and replayed from a graph per bucket that reads the decodes' ids on the device and the
verifications' from the staged ids, ending, like a mixed graph, at the hidden states::

    rows    | decode 0 | ... | decode d-1 | v0: C..C+m0 | v1: C'..C'+m1 | ... | padding (sink) |
    context |  C_d + 1 per decode         | C+1 .. C+m0+1 (causal)      ...  |       0        |

Block tables: every running request owns a row of a persistent ``[max_num_seqs, max_blocks]``
device table (and its host mirror). Each step appends the blocks the scheduler gave the request
since the last step (a decode needs one every ``block_size`` steps), so the copy carries only
those; the step's ``block_tables`` is a device gather of its sequences' rows. A preempted
request gives its row up; its token history stays, so its recompute feeds prompt + generated
tokens again.

Token history: the runner keeps each request's prompt + generated ids, in per-row numpy arrays
while it holds a row (``wait`` appends the step's tokens with one vectorised write). A chunk's
inputs are ``history[C : C + n]`` with ``C = num_computed_tokens``. A decode's input is its row's
last sampled token, which the step that sampled it also wrote into a device array, so the host
need not have read it: ``submit`` queues a step while the previous one still runs (at most one
in flight), and ``wait`` reads its tokens. Positions come from each row's scheduled length
(tokens read back plus those in flight). Rows are twice ``max_num_seqs``: a request finishing in
the step in flight keeps its row until that step is read. While the scheduler hands out the
same decode tuple (event mode, decode set unchanged), a decode step's inputs are staged from
these arrays without a Python loop over the requests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from executor import verify
from executor.attention import PagedAttention
from executor.drafter import Drafter
from executor.kernels.tiling import decode_num_splits
from executor.model import CausalLM
from executor.sampling import SamplingBatch, SamplingParams, sample
from horizon.acceptance import AcceptanceModel
from horizon.plan import StepPlan
from horizon.request import Request
from horizon.step_buckets import (
    GRAPH_BATCH_SIZES,
    bucket_of,
    decode_buckets,
    mixed_token_buckets,
)

GREEDY = SamplingParams()

BlocksOf = Callable[[Request], Sequence[int]]


@dataclass
class StepOutput:
    """What one ``execute`` produced.

    Attributes:
        requests: the requests that emitted a token (decodes, then chunks ending a prefill).
        tokens: their tokens, same order.
        request_ids: their ids, same order.
        logits: ``[len(requests), vocab]`` logits they were sampled from, in the model's dtype
            (a graph's static output on the GPU: overwritten by the next step; copy to keep).
        all_logits: ``[num_tokens, vocab]`` fp32 logits of every token of the flat batch, only
            when ``execute(..., all_logits=True)``.
        verified: the tokens each of the plan's ``verifies`` emitted (its accepted drafts and
            one of the target's, cut to its emit limit / a stop id), in plan order.
        accepted: ``len(verified[j]) - 1`` each: ``StepResult.accepted``.
    """

    requests: list[Request]
    tokens: list[int]
    request_ids: list[int]
    logits: torch.Tensor | None = None
    all_logits: torch.Tensor | None = None
    verified: list[list[int]] | None = None
    accepted: list[int] | None = None


class _Seq:
    """One request's state in the runner. While it holds a block-table row its token history
    lives in the runner's per-row arrays; otherwise (not yet started, or preempted) in
    ``tokens``."""

    __slots__ = ("tokens", "num_prompt", "row", "params")

    def __init__(self, tokens: list[int], num_prompt: int, params: SamplingParams) -> None:
        self.tokens: list[int] | None = tokens  # prompt + generated ids, while row == -1
        self.num_prompt = num_prompt
        self.row = -1
        self.params = params


class _Staging:
    """Regions of the step's int32 metadata, as numpy views (host) and tensor views (device).

    On CUDA the host side is two pinned buffers used in turn (``flip`` before filling one): a step
    is filled while the previous step's upload may still be queued behind the GPU's work, and the
    buffer it fills was last uploaded two steps ago, before the step the runner has since waited
    for (``ModelRunner.submit``'s contract)."""

    def __init__(self, max_tokens: int, max_seqs: int, max_updates: int, device) -> None:  # noqa: ANN001
        # an expanded verification step (ModelRunner.verify_as_decode) has a decode row, so a
        # context length and a block-table row, per token
        max_rows = max(max_seqs, max_tokens)
        sizes = {
            "ids": max_tokens,
            "src": max_tokens,
            "pos": max_tokens,
            "slot": max_tokens,
            "ctx": max_rows,
            "cu": max_seqs + 1,
            "rows": max_rows,
            "logit": max_seqs,
            "erow": max_seqs,
            "upd_idx": max_updates,
            "upd_val": max_updates,
            "draft_dst": max_tokens,  # drafts made on the device: their tokens' places
            "draft_src": max_tokens,  # and where each is in the drafter's tensor
        }
        sizes = {k: -(-n // 16) * 16 for k, n in sizes.items()}  # 64-byte aligned regions
        total = sum(sizes.values())
        on_cuda = device.type == "cuda"
        hosts = [torch.zeros(total, dtype=torch.int32, pin_memory=on_cuda)]
        if on_cuda:
            hosts.append(torch.zeros(total, dtype=torch.int32, pin_memory=True))
        self.dev = hosts[0] if not on_cuda else torch.zeros_like(hosts[0], device=device)
        self._hosts = hosts
        self._views: list[dict[str, np.ndarray]] = []
        self.t: dict[str, torch.Tensor] = {}
        offsets = {}
        start = 0
        for name, n in sizes.items():
            offsets[name] = (start, start + n)
            self.t[name] = self.dev[start : start + n]
            start += n
        for h in hosts:
            host_np = h.numpy()
            self._views.append({k: host_np[a:b] for k, (a, b) in offsets.items()})
        self._cur = 0
        self.host = hosts[0]
        self.np: dict[str, np.ndarray] = self._views[0]
        self.max_updates = max_updates

    def flip(self) -> None:
        """Fill the other host buffer from now on (no-op with one)."""
        self._cur = (self._cur + 1) % len(self._hosts)
        self.host = self._hosts[self._cur]
        self.np = self._views[self._cur]

    def upload(self) -> None:
        if self.dev is not self.host:
            self.dev.copy_(self.host, non_blocking=True)


class _Pending:
    """A submitted step whose tokens are still on their way to the host."""

    __slots__ = (
        "emitters", "rids", "rows", "m", "host", "event", "commit", "logits", "all_logits",
        "verify",
    )  # fmt: skip

    def __init__(self, emitters, rids, rows, m, host, event, commit, logits, all_logits) -> None:  # noqa: ANN001
        self.emitters, self.rids, self.rows, self.m = emitters, rids, rows, m
        self.host, self.event, self.commit = host, event, commit
        self.logits, self.all_logits = logits, all_logits
        self.verify: _Verifies | None = None


class _Verifies:
    """A step's verifications: rows, drafts, emit limits, the judgement's host copy."""

    __slots__ = (
        "requests", "rows", "starts", "drafts", "limits", "stop_ids", "host", "n", "next", "stated",
        "dev", "flat", "t0",
    )  # fmt: skip

    def __init__(self, requests, rows, starts, drafts, limits, stop_ids) -> None:  # noqa: ANN001
        self.requests, self.rows, self.starts = requests, rows, starts
        self.drafts, self.limits, self.stop_ids = drafts, limits, stop_ids
        self.host: np.ndarray | None = None  # [2, n]: accept, alt
        self.n = sum(len(d) + 1 for d in drafts)  # query rows
        self.next: np.ndarray | None = None  # each row's next draft (verify.next_drafts)
        self.stated: np.ndarray | None = None  # accepted drafts drawn from a stated model
        # drafts left on the device by the drafter (``propose_on_device``; ``drafts`` hold
        # zeros until the step is read back): its tensor, the drafts in query order, and the
        # verifications' first token in the step
        self.dev: torch.Tensor | None = None
        self.flat: torch.Tensor | None = None
        self.t0 = 0


class ModelRunner:
    """Executes plans on a ``CausalLM`` with a paged KV tensor.

    Args:
        model: the decoder (its device and dtype are the KV tensor's).
        kv_cache: ``[layers, 2, num_blocks, block_size, kv_heads, head_dim]``; block ``b`` is the
            scheduler's block id ``b``. Mutated by every step.
        max_num_seqs / max_num_batched_tokens / max_model_len: the scheduler's limits; a plan
            beyond them is an AssertionError.
        backend: attention kernels, "triton" (default on CUDA) or "torch" (default on CPU).
        cuda_graphs: replay decode-only and mixed steps from CUDA graphs (default: on CUDA with
            Triton).
        graph_batch_sizes: buckets a decode batch is padded to (graphs, or ``pad_decodes``).
        pad_decodes: pad eager decode-only steps to the buckets too (tests the graphs' padding
            without a GPU).
        pad_mixed: pad eager mixed steps as their graphs do (same purpose).
        mixed_graphs: replay mixed steps from graphs too (default: with ``cuda_graphs``).
        fused: run the model through ``executor.fused.FusedForward`` (Triton kernels for
            RMSNorm, RoPE, SiLU; default: with the Triton backend), else ``model.forward``.
        prompt_of / sampling_of: a new request's prompt ids and sampling parameters (default:
            ``request.prompt_token_ids`` and greedy).
        drafter: proposes the drafts of a plan's ``verifies`` (``executor.drafter``); needed
            only for plans that verify (speculative decoding).
        acceptance: a stated acceptance model (``horizon.acceptance``) for targets with random
            weights: each verification accepts as many of its ``m`` drafts as the model draws
            (``sample`` of the request at its pre-step counters, capped at ``m``) instead of
            those the target's judgement accepts; it emits them and the target's token at the
            first rejected position, so histories and KV stay what the forward computed. The
            verify forward, its judgement and the drafter still run (their costs are real).
            None (default): greedy acceptance / rejection sampling.
        verify_as_decode: run a step of decodes and verifications without prefill chunks as an
            expanded decode step (default): each verification of ``m`` drafts is ``m + 1``
            decode rows (row ``i``: its request's block-table row, position ``C + i``, context
            ``C + i + 1``, input its last token or draft ``i``), attended by the split-K decode
            kernel, padded to ``verify_buckets`` and replayed from a graph per bucket with
            ``cuda_graphs``. Off, or for a step with chunks: the mixed path (ragged chunks).

    Contracts:
        * ``execute`` reads the plan and the requests' counters as they were when the plan was
          made (call it before ``Scheduler.update``) and the block tables through ``blocks_of``;
          it never changes scheduler state.
        * With ``commit=True`` (default) each emitted token is appended to its request's history.
        * ``release(request)`` must be called when a request finishes; preempted requests (in a
          plan's ``preempted``) are handled by ``execute``.
        * A plan's ``verifies`` (speculative decoding): each request's drafts come from the
          drafter at submit (at most the plan's ``k``; fewer if it finds fewer, or if the
          request's emit limit is lower), its ``m + 1`` query tokens (last token and drafts)
          run in the same forward as the step's decodes and chunks: as decode rows when the
          step has no chunks (``verify_as_decode``), else as a mixed step (replayed from the
          mixed-step graph of its padded token count with ``mixed_graphs``);
          ``num_verify_steps`` counts this run's verification steps by path (``decode`` /
          ``mixed``);
          ``wait`` commits the emitted tokens (``StepOutput.verified``) and forgets the mirrored
          blocks beyond them, as the scheduler's ``update`` trims them. Such a step needs
          every earlier step read back (no step in flight) and is not pipelined.
    """

    def __init__(
        self,
        model: CausalLM,
        kv_cache: torch.Tensor,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        backend: str | None = None,
        cuda_graphs: bool | None = None,
        graph_batch_sizes: Sequence[int] = GRAPH_BATCH_SIZES,
        pad_decodes: bool = False,
        pad_mixed: bool = False,
        mixed_graphs: bool | None = None,
        prompt_of: Callable[[Request], Sequence[int]] | None = None,
        sampling_of: Callable[[Request], SamplingParams] | None = None,
        fused: bool | None = None,
        drafter: Drafter | None = None,
        acceptance: AcceptanceModel | None = None,
        verify_as_decode: bool = True,
    ) -> None:
        self.model = model
        self.verify_as_decode = verify_as_decode
        dv = None if drafter is None else drafter.vocab_size
        if dv is not None and dv < model.config.vocab_size:
            raise ValueError(
                f"ModelRunner.drafter: vocab_size {dv} is below the target's "
                f"{model.config.vocab_size} (the target's ids would index past the draft's rows)"
            )
        self.drafter = drafter
        self.acceptance = acceptance
        self.device = kv_cache.device
        on_cuda = self.device.type == "cuda"
        self.backend = backend or ("triton" if on_cuda else "torch")
        self.cuda_graphs = (
            (on_cuda and self.backend == "triton") if cuda_graphs is None else cuda_graphs
        )
        if self.cuda_graphs and not on_cuda:
            raise ValueError("cuda_graphs needs a CUDA device")
        self.block_size = kv_cache.shape[3]
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.max_blocks = -(-max_model_len // self.block_size)
        self.attention = PagedAttention(kv_cache, model.config.attention_scale, self.backend)
        self.fused = self.backend == "triton" if fused is None else fused
        if self.fused:
            from executor.fused import FusedForward

            self._forward = FusedForward(model)
        else:
            self._forward = model
        self._prompt_of = prompt_of or _prompt_ids
        self._sampling_of = sampling_of or (lambda r: GREEDY)
        self._init_rows()
        self._init_steps()
        self._init_graphs(graph_batch_sizes, pad_decodes, pad_mixed, mixed_graphs)

    def _init_rows(self) -> None:
        """Per block-table row state (device table and host mirror, token histories) and the
        staging buffers."""
        max_num_seqs, max_model_len = self.max_num_seqs, self.max_model_len
        # rows: twice the sequences, as a request finishing in the step in flight keeps its row
        # until that step's tokens are read, while the next step may start as many new ones
        rows = self.num_rows = 2 * max_num_seqs
        self._bt_host = np.zeros((rows, self.max_blocks), dtype=np.int32)
        self._bt_dev = torch.zeros((rows, self.max_blocks), dtype=torch.int32)
        self._bt_dev = self._bt_dev.to(self.device)
        self._bt_flat = self._bt_dev.view(-1)
        updates = max(4096, 2 * max_num_seqs + 2 * (self.max_num_batched_tokens // self.block_size))
        self._s = _Staging(self.max_num_batched_tokens, max_num_seqs + 1, updates, self.device)
        self._upd_idx: list[int] = []
        self._upd_val: list[int] = []
        self._num_updates = 0
        self._seqs: dict[int, _Seq] = {}
        self._free_rows = list(range(rows - 1, -1, -1))
        # per block-table row: token history (prompt + generated), its length (tokens read back),
        # its scheduled length (plus tokens of submitted steps not yet read), blocks mirrored
        self._hist = np.zeros((rows, max_model_len), dtype=np.int32)
        self._len = np.zeros(rows, dtype=np.int64)
        self._slen = np.zeros(rows, dtype=np.int64)
        self._nblk = np.zeros(rows, dtype=np.int64)
        # each row's last token on the device (a decode's input), written by the step that
        # samples it; index ``rows`` is a sink for padding rows
        self._last_tok = torch.zeros(rows + 1, dtype=torch.int32, device=self.device)
        self._sink = rows
        self._stale: set[int] = set()  # rows whose device last token the host must rewrite

    def _init_steps(self) -> None:
        """Read-back buffers, the steps in flight, the cached decode rows, the sampled count."""
        pin = self.device.type == "cuda"
        self._tok_host = [
            torch.zeros(self.max_num_seqs + 1, dtype=torch.int32, pin_memory=pin) for _ in range(2)
        ]
        self._tok_flip = 0
        self._in_flight = 0  # submitted steps not yet waited for
        # the last decode tuple seen, and its rows / ids: the event scheduler hands out the same
        # tuple object while the decode set is unchanged, so steady decoding skips a Python loop
        self._dec_key: tuple[Request, ...] | None = None
        self._dec_rows = np.zeros(0, dtype=np.int64)
        self._dec_rids: list[int] = []
        self._num_sampled = 0  # sequences whose tokens are not the argmax (needs_sampler)
        # speculation, this run: drafts the drafter proposed, and of them those accepted;
        # verification steps by path (expanded decode rows, or the mixed path's ragged chunks)
        self.num_proposed = self.num_accepted = 0
        self.num_verify_steps = {"decode": 0, "mixed": 0}

    def _init_graphs(
        self,
        graph_batch_sizes: Sequence[int],
        pad_decodes: bool,
        pad_mixed: bool,
        mixed_graphs: bool | None,
    ) -> None:
        """Padding buckets and the (lazily captured) CUDA graphs of decode-only, mixed and
        expanded verification steps."""
        self.graph_batch_sizes = decode_buckets(self.max_num_seqs, graph_batch_sizes)
        # an expanded verification step's rows: the decode buckets, then the mixed steps' token
        # buckets, up to the token budget (which counts k + 1 rows per verification)
        budget = self.max_num_batched_tokens
        sizes = (*graph_batch_sizes, *mixed_token_buckets(budget))
        self.verify_buckets = decode_buckets(budget, sizes)
        self.pad_decodes = pad_decodes or self.cuda_graphs
        self.mixed_graphs = self.cuda_graphs if mixed_graphs is None else mixed_graphs
        if self.mixed_graphs and not self.cuda_graphs:
            raise ValueError("mixed_graphs needs cuda_graphs")
        self.mixed_token_buckets = mixed_token_buckets(self.max_num_batched_tokens)
        self.pad_mixed = pad_mixed or self.mixed_graphs
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._mixed: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._verify: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None

    # -- sequences -------------------------------------------------------------------------------
    def start(
        self,
        request: Request,
        prompt_ids: Sequence[int] | None = None,
        generated: Sequence[int] = (),
        params: SamplingParams | None = None,
    ) -> None:
        """Register ``request``'s token history (``execute`` does it on a request's first chunk,
        from ``prompt_of``/``sampling_of``; the profiler registers synthetic ones)."""
        rid = request.request_id
        assert rid not in self._seqs, f"request {rid} already started"
        prompt = list(self._prompt_of(request) if prompt_ids is None else prompt_ids)
        if len(prompt) != request.num_prompt_tokens:
            raise ValueError(
                f"request {rid}: {len(prompt)} prompt ids for {request.num_prompt_tokens} tokens"
            )
        params = params or self._sampling_of(request)
        self._seqs[rid] = _Seq(prompt + list(generated), len(prompt), params)
        self._num_sampled += params.needs_sampler

    def _tokens(self, s: _Seq) -> list[int]:
        if s.row < 0:
            return s.tokens
        return self._hist[s.row, : self._len[s.row]].tolist()

    def generated(self, request: Request) -> list[int]:
        """Tokens ``request`` has generated so far (a copy)."""
        s = self._seqs[request.request_id]
        return self._tokens(s)[s.num_prompt :]

    def unfinished(self) -> dict[int, list[int]]:
        """Generated tokens of every request the runner still holds, by request id."""
        return {rid: self._tokens(s)[s.num_prompt :] for rid, s in self._seqs.items()}

    def release(self, request: Request) -> list[int]:
        """Forget a finished request; returns its generated tokens. Its tokens must have been
        read back (``wait`` for the step that emitted its last one first)."""
        s = self._seqs[request.request_id]
        assert s.row < 0 or self._len[s.row] == self._slen[s.row], (
            f"request {request.request_id} released with tokens in flight"
        )
        del self._seqs[request.request_id]
        self._free_row(s)
        self._num_sampled -= s.params.needs_sampler
        if self.drafter is not None:
            self.drafter.forget(request.request_id)
        return s.tokens[s.num_prompt :]

    def drop(self, request: Request) -> None:
        """Forget an aborted request (``Scheduler.take_aborted``) if it was started here; a
        no-op otherwise (it never ran). As ``release``, no token of it may be in flight."""
        if request.request_id in self._seqs:
            self.release(request)

    def reset(self) -> None:
        """Forget every request (a new run); captured graphs are kept."""
        for rid, s in self._seqs.items():
            self._free_row(s)
            if self.drafter is not None:
                self.drafter.forget(rid)
        self._seqs.clear()
        self._num_sampled = 0
        self.num_proposed = self.num_accepted = 0
        self.num_verify_steps = {"decode": 0, "mixed": 0}
        self._dec_key = None
        assert len(self._free_rows) == self.num_rows
        assert self._in_flight == 0, "reset with a submitted step not waited for"

    def check_integrity(self) -> None:
        """Rows, token histories and the steps in flight agree: every row is held by one
        sequence or free, a held row's scheduled length leads its read-back length by at most
        the steps in flight, and the sampling count matches the sequences'."""
        held = [s.row for s in self._seqs.values() if s.row >= 0]
        assert len(held) == len(set(held)), "two sequences share a row"
        free = set(self._free_rows)
        assert len(free) == len(self._free_rows), "a row is free twice"
        assert free.isdisjoint(held), "a held row is also free"
        assert len(free) + len(held) == self.num_rows, "a row is neither held nor free"
        assert 0 <= self._in_flight <= 2, f"{self._in_flight} steps in flight"
        if held:
            rows = np.array(held, dtype=np.int64)
            lead = self._slen[rows] - self._len[rows]
            assert np.all((lead >= 0) & (lead <= self._in_flight)), "scheduled length out of step"
            assert np.all(self._len[rows] <= self.max_model_len)
        assert all(s.tokens is not None for s in self._seqs.values() if s.row < 0)
        assert self._num_sampled == sum(s.params.needs_sampler for s in self._seqs.values())
        drafter_check = getattr(self.drafter, "check_integrity", None)
        if drafter_check is not None:  # a drafter with state (a draft model's slots)
            drafter_check()

    def check_against(self, requests: Sequence[Request], blocks_of: BlocksOf) -> None:
        """With no step in flight, each of ``requests`` (running, per the scheduler) that holds
        a row agrees with the scheduler: its history is ``num_tokens`` long and its mirrored
        blocks are a prefix of its block table (what survives a trim of rejected drafts)."""
        assert self._in_flight == 0, "check_against with a step in flight"
        for r in requests:
            s = self._seqs.get(r.request_id)
            if s is None or s.row < 0:
                continue
            row, table = s.row, list(blocks_of(r))
            assert self._len[row] == r.num_tokens, f"request {r.request_id}: history length"
            k = int(self._nblk[row])
            assert k <= len(table), f"request {r.request_id}: {k} mirrored of {len(table)} blocks"
            assert self._bt_host[row, :k].tolist() == table[:k], f"request {r.request_id}: blocks"

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    def append_tokens(self, requests: Sequence[Request], tokens: Sequence[int]) -> None:
        """Append ``tokens[i]`` to ``requests[i]``'s history (``commit`` does it for sampled
        tokens, vectorised; a check forces tokens of its own this way)."""
        for r, t in zip(requests, tokens):
            s = self._seqs[r.request_id]
            if s.row < 0:
                s.tokens.append(t)
            else:
                assert self._len[s.row] == self._slen[s.row], "append_tokens with tokens in flight"
                self._hist[s.row, self._len[s.row]] = t
                self._len[s.row] += 1
                self._slen[s.row] += 1
                self._stale.add(s.row)

    def _take_row(self, s: _Seq) -> int:
        """Give ``s`` a block-table row; its history moves into the row arrays."""
        row = self._free_rows.pop()
        n = len(s.tokens)
        assert n <= self.max_model_len, f"{n} tokens exceed max_model_len {self.max_model_len}"
        self._hist[row, :n] = s.tokens
        self._len[row] = self._slen[row] = n
        self._nblk[row] = 0
        s.row, s.tokens = row, None
        return row

    def _free_row(self, s: _Seq) -> None:
        """Give the row back (preempted or finished); the history moves back into ``s``."""
        if s.row >= 0:
            row = s.row
            assert self._len[row] == self._slen[row], "a row freed with tokens in flight"
            s.tokens = self._hist[row, : self._len[row]].tolist()
            self._free_rows.append(row)
            self._stale.discard(row)
            s.row = -1
            self._dec_key = None  # the cached decode rows may name this row

    def _sync_row(self, row: int, table: Sequence[int]) -> None:
        """Mirror the blocks appended to ``row``'s table since the last step."""
        k, n = int(self._nblk[row]), len(table)
        assert k < n <= self.max_blocks, f"block table of {n} blocks (mirrored {k})"
        new = table[k:n]
        self._bt_host[row, k:n] = new
        base = row * self.max_blocks
        self._upd_idx.extend(range(base + k, base + n))
        self._upd_val.extend(new)
        self._nblk[row] = n

    # -- one step --------------------------------------------------------------------------------
    def execute(
        self,
        plan: StepPlan,
        blocks_of: BlocksOf,
        commit: bool = True,
        all_logits: bool = False,
        emit_limits: Sequence[int] | None = None,
        stop_ids: frozenset[int] = frozenset(),
    ) -> StepOutput:
        """``wait(submit(...))``: run ``plan`` and read its tokens back."""
        return self.wait(self.submit(plan, blocks_of, commit, all_logits, emit_limits, stop_ids))

    @torch.no_grad()
    def submit(
        self,
        plan: StepPlan,
        blocks_of: BlocksOf,
        commit: bool = True,
        all_logits: bool = False,
        emit_limits: Sequence[int] | None = None,
        stop_ids: frozenset[int] = frozenset(),
    ) -> _Pending:
        """Queue ``plan``'s step on the device and return without waiting for it; ``wait`` gives
        its tokens.

        Args:
            plan: the scheduler's plan (not yet passed to ``update``).
            blocks_of: each request's block table (e.g. ``scheduler.kv.blocks_of``).
            commit: append the tokens to the requests' histories (the profiler repeats a step
                without committing).
            all_logits: also return fp32 logits of every token (eager path; for checks).
            emit_limits: for the plan's ``verifies``, the most tokens each may emit (the
                stopping rule's tokens left; default ``k + 1``); drafts beyond are not proposed.
            stop_ids: a verifying request's emitted tokens end at the first of these.

        A decode's input token is read on the device from what the previous step sampled, so a
        step may be submitted while the one before it is in flight (one at most: ``wait`` for a
        step before submitting the one after next). A plan that preempts a request with a token
        in flight, or a request finishing in the step in flight (``release``), must wait for
        that step first (AssertionError otherwise).
        """
        assert self._in_flight <= 1, "two steps in flight: wait for the older one first"
        self._preempt(plan.preempted)
        if plan.is_empty:
            return _Pending([], [], None, 0, None, None, commit, None, None)
        self._s.flip()
        nd = len(plan.decodes)
        ver = None
        if plan.verifies:
            assert self._in_flight == 0, "a step that verifies drafts with a step in flight"
            ver = self._drafts(plan, emit_limits, stop_ids)
        shape = (0, 0, 0) if all_logits else self._padding(plan, nd, ver)
        bucket = shape[0]
        staged = self._prepare(plan, blocks_of, shape, ver)
        emitters, rids, rows_e, num_tokens, num_seqs = staged
        self._upload(ver)
        m = len(emitters)
        logits, tokens, logits_all, judged = self._forward_step(
            shape, nd, num_tokens, num_seqs, m, all_logits, ver
        )
        if m and self._num_sampled:
            tokens = self._sample(rows_e, emitters, logits, m)
        if m and (not bucket or self._num_sampled):  # a decode graph wrote its greedy tokens
            self._last_tok[self._s.t["erow"][:m]] = tokens[:m]
        host, event = self._read_back(tokens, rows_e, m, commit)
        logits = None if logits is None else logits[:m]  # the emitters' rows
        step = _Pending(emitters, rids, rows_e, m, host.numpy(), event, commit, logits, logits_all)
        if ver is not None:  # a verification step is read back at once
            self._read_verification(ver, judged)
            step.verify = ver
        return step

    def _upload(self, ver: _Verifies | None) -> None:
        """Send the staged step to the device: the staging buffer, the block tables' new
        entries, the last tokens the host rewrote, and drafts made on the device into place."""
        self._s.upload()
        self._apply_updates()
        self._restore_stale()
        if ver is not None and ver.dev is not None:
            self._place_drafts(ver)

    def _preempt(self, preempted: Sequence[Request]) -> None:
        """Give back the rows of the plan's preempted requests (their histories are kept)."""
        for r in preempted:
            s = self._seqs.get(r.request_id)
            if s is not None:
                self._free_row(s)

    def _read_back(
        self, tokens: torch.Tensor, rows_e: np.ndarray, m: int, commit: bool
    ) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """Queue the copy of the step's ``m`` emitted tokens to a host buffer (the two buffers
        alternate) and count the step in flight; with ``commit`` the rows' lengths grow by the
        token each. The buffer and the event that marks the copy's end (None off CUDA)."""
        if not commit:
            self._stale.update(rows_e.tolist())  # the device holds tokens the host does not
        host = self._tok_host[self._tok_flip]
        self._tok_flip ^= 1
        if m:
            host[:m].copy_(tokens[:m], non_blocking=True)
        event = torch.cuda.Event() if self.device.type == "cuda" else None
        if event is not None:
            event.record()
        if commit:
            self._slen[rows_e] += 1
        self._in_flight += 1
        return host, event

    def wait(self, step: _Pending) -> StepOutput:
        """Block until ``step``'s tokens are on the host; commit them (if submitted so)."""
        if step.rows is None:  # an empty plan
            return StepOutput([], [], [])
        if step.event is not None:
            step.event.synchronize()
        self._in_flight -= 1
        m = step.m
        tokens = step.host[:m].copy()
        if step.commit and m:
            rows = step.rows
            self._hist[rows, self._len[rows]] = tokens
            self._len[rows] += 1
        out = StepOutput(step.emitters, tokens.tolist(), step.rids, step.logits, step.all_logits)
        if step.verify is not None:
            out.verified = self._verified(step.verify, step.commit)
            out.accepted = [len(t) - 1 for t in out.verified]
        return out

    def _forward_step(self, shape, nd, num_tokens, num_seqs, m, all_logits, ver):  # noqa: ANN001, ANN202
        """The step's forward (a decode graph's bucket, a mixed step's, an expanded
        verification step's, or eager; ``shape``: ``_padding``'s): the emitters' logits and
        greedy tokens, every token's logits (``all_logits``), and the verifications' judgement
        (``ver``)."""
        bucket, mixed, expanded = shape
        logits_all = vlogits = judged = None
        v0 = num_tokens - ver.n if ver is not None else -1  # the verifications' first token
        if ver is not None:
            self.num_verify_steps["decode" if expanded else "mixed"] += 1
        if bucket:
            logits, tokens = self._decode_step(bucket)
        elif expanded:
            logits, tokens, vlogits = self._verify_step(expanded, m, v0, num_tokens)
        elif mixed:
            logits, tokens, vlogits = self._mixed_step(mixed, m, v0, num_tokens)
        else:
            logits, tokens, logits_all, vlogits = self._eager(
                nd, num_tokens, num_seqs, m, all_logits, v0
            )
        if ver is not None:
            judged = self._judge(ver, vlogits)
        return logits, tokens, logits_all, judged

    def _restore_stale(self) -> None:
        """Rewrite the device's last token of rows the host changed (forced tokens, a step that
        did not commit, decodes registered with generated tokens)."""
        if not self._stale:
            return
        rows = sorted(self._stale)
        self._stale.clear()
        last = self._hist[rows, self._len[rows] - 1]
        idx = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
        self._last_tok[idx] = torch.from_numpy(last).to(self.device, non_blocking=True)

    def _padding(self, plan: StepPlan, nd: int, ver: _Verifies | None = None) -> tuple[int, ...]:
        """``(bucket, mixed, expanded)``: the decode bucket a decode-only step, the token bucket
        a mixed step (chunks, or verifications on the mixed path) is padded to (0: not padded),
        and an expanded verification step's rows (padded to ``verify_buckets`` as decodes are;
        0: not one), capturing that size's graph on first use."""
        bucket = mixed = 0
        if not plan.prefills and ver is None:
            if self.pad_decodes:
                bucket = self._bucket(nd)
                if bucket and self.cuda_graphs and bucket not in self._graphs:
                    self._capture(bucket)
            return bucket, 0, 0
        rows = nd + (0 if ver is None else ver.n)
        if not plan.prefills and self.verify_as_decode and rows <= self.verify_buckets[-1]:
            expanded = bucket_of(rows, self.verify_buckets) if self.pad_decodes else rows
            if self.cuda_graphs and expanded not in self._verify:
                self._capture_verify(expanded)
            return 0, 0, expanded
        if self.pad_mixed:
            mixed = self._mixed_bucket(rows + sum(n for _, n in plan.prefills))
            if self.mixed_graphs and mixed not in self._mixed:
                self._capture_mixed(mixed)
        return bucket, mixed, 0

    def _bucket(self, n: int) -> int:
        for b in self.graph_batch_sizes:
            if b >= n:
                return b
        return 0

    def _mixed_bucket(self, n: int) -> int:
        for b in self.mixed_token_buckets:
            if b >= n:
                return b
        raise AssertionError(f"a step of {n} tokens exceeds max_num_batched_tokens")

    def _prepare(self, plan: StepPlan, blocks_of: BlocksOf, shape, ver=None):  # noqa: ANN001, ANN202
        """Fill the host staging buffer (verifications, ``ver``, after the chunks; ``shape``:
        ``_padding``'s). Returns the emitting requests, their ids and rows, and the step's token
        and sequence (an expanded step: row) counts."""
        bucket, mixed, expanded = shape
        self._upd_idx.clear()
        self._upd_val.clear()
        h = self._s.np
        nd = len(plan.decodes)
        rows_d = self._decode_rows(plan.decodes, blocks_of) if nd else self._dec_rows[:0]
        chunk = self._chunks(plan.prefills, blocks_of) if plan.prefills else None
        num_tokens, num_seqs = nd, nd
        ctx, cu, logit = h["ctx"], h["cu"], h["logit"]
        cu[0] = 0
        cu[1 : nd + 1] = np.arange(1, nd + 1)
        logit[:nd] = np.arange(nd)
        ctx[:nd] = h["pos"][:nd] + 1
        h["rows"][:nd] = rows_d
        h["src"][:nd] = rows_d
        emitters, rids, rows_e = list(plan.decodes), self._dec_rids if nd else [], rows_d
        if chunk is not None:
            ids, pos, rows_p, q, ends, emit = chunk
            num_tokens = nd + len(ids)
            num_seqs = nd + len(rows_p)
            h["ids"][nd:num_tokens] = ids
            h["src"][nd:num_tokens] = -1
            h["pos"][nd:num_tokens] = pos
            ctx[nd:num_seqs] = pos[ends - 1] + 1
            cu[nd + 1 : num_seqs + 1] = nd + ends
            h["rows"][nd:num_seqs] = rows_p
            e = [i for i, x in enumerate(emit) if x]
            logit[nd : nd + len(e)] = nd + ends[e] - 1
            emitters += [plan.prefills[i][0] for i in e]
            rids = rids + [plan.prefills[i][0].request_id for i in e]
            rows_e = np.concatenate([rows_d, rows_p[e]])
        tok_rows = rows_d if chunk is None else np.concatenate([rows_d, np.repeat(rows_p, q)])
        if ver is not None:
            v_rows = self._stage_verifies(
                ver, plan.verifies, blocks_of, num_tokens, num_seqs, expanded > 0
            )
            tok_rows = np.concatenate([tok_rows, v_rows])
            num_tokens += ver.n
            num_seqs = num_tokens if expanded else num_seqs + len(ver.rows)
        assert num_tokens <= self.max_num_batched_tokens
        assert expanded or num_seqs <= self.max_num_seqs
        p = h["pos"][:num_tokens]
        bs = self.block_size
        h["slot"][:num_tokens] = self._bt_host[tok_rows, p // bs] * bs + p % bs
        h["erow"][: len(rows_e)] = rows_e
        if bucket > nd:
            self._pad(nd, bucket)
        if expanded > num_tokens:
            self._pad(num_tokens, expanded)
        if mixed:
            self._pad_mixed(num_tokens, mixed, num_seqs)
        self._stage_updates()
        return emitters, rids, rows_e, num_tokens, num_seqs

    def _decode_rows(self, decodes: tuple[Request, ...], blocks_of: BlocksOf) -> np.ndarray:
        """Stage the decodes' ids and positions; returns their rows."""
        if decodes is not self._dec_key:
            seqs = self._seqs
            rows = [seqs[r.request_id].row for r in decodes]
            if min(rows) < 0:  # synthetic decodes (the profiler's) start without a row
                rows = [
                    s.row if s.row >= 0 else self._take_row(s)
                    for s in map(seqs.get, (r.request_id for r in decodes))
                ]
                self._stale.update(rows)  # their last token is the host's
            self._dec_key = decodes
            self._dec_rows = np.array(rows, dtype=np.int64)
            self._dec_rids = [r.request_id for r in decodes]
        rows = self._dec_rows
        pos = self._slen[rows] - 1
        # a decode whose position is past its mirrored blocks got a block this step
        for i in np.flatnonzero(self._nblk[rows] * self.block_size <= pos).tolist():
            self._sync_row(int(rows[i]), blocks_of(decodes[i]))
        self._s.np["pos"][: len(decodes)] = pos  # ids: the device's last tokens (src)
        return rows

    def _chunks(self, prefills, blocks_of: BlocksOf):  # noqa: ANN001, ANN202
        """The chunks' token ids, positions, rows, lengths, cumulative ends, emit flags."""
        seqs, hist = self._seqs, self._hist
        ids, starts, q_lens, rows, emit = [], [], [], [], []
        for r, n in prefills:
            s = seqs.get(r.request_id)
            if s is None:
                self.start(r)
                s = seqs[r.request_id]
            row = s.row if s.row >= 0 else self._take_row(s)
            table = blocks_of(r)
            if len(table) != self._nblk[row]:
                self._sync_row(row, table)
            c = r.num_computed_tokens
            length = int(self._len[row])
            assert length == self._slen[row] == r.num_tokens, (
                f"request {r.request_id}: history out of step (or a token in flight)"
            )
            ids.append(hist[row, c : c + n])
            starts.append(c)
            q_lens.append(n)
            rows.append(row)
            emit.append(c + n == length)  # the chunk ends its prefill: it emits a token
        q = np.array(q_lens, dtype=np.int64)
        ends = np.cumsum(q)
        pos = np.repeat(np.array(starts, dtype=np.int64) - (ends - q), q) + np.arange(ends[-1])
        return np.concatenate(ids), pos, np.array(rows, dtype=np.int64), q, ends, emit

    def _pad(self, lo: int, hi: int) -> None:
        h = self._s.np
        h["ids"][lo:hi] = 0
        h["src"][lo:hi] = self._sink
        h["pos"][lo:hi] = 0
        h["slot"][lo:hi] = -1
        h["ctx"][lo:hi] = 0
        h["rows"][lo:hi] = 0

    def _pad_mixed(self, num_tokens: int, tokens: int, num_seqs: int) -> None:
        """Tokens ``[num_tokens, tokens)`` with slot -1 (no KV write); sequences ``[num_seqs,
        max_num_seqs]`` of context 0 (padding: attention gives zeros), the last of which holds
        those tokens, the others none."""
        h = self._s.np
        h["ids"][num_tokens:tokens] = 0
        h["src"][num_tokens:tokens] = -1
        h["pos"][num_tokens:tokens] = 0
        h["slot"][num_tokens:tokens] = -1
        s = self.max_num_seqs + 1  # the last one always a padding sequence
        h["ctx"][num_seqs:s] = 0
        h["rows"][num_seqs:s] = 0
        h["cu"][num_seqs + 1 : s] = num_tokens
        h["cu"][s] = tokens  # the spare tokens are the last padding sequence's: zeros

    def _stage_updates(self) -> None:
        k = len(self._upd_idx)
        self._num_updates = k
        if 0 < k <= self._s.max_updates:
            self._s.np["upd_idx"][:k] = self._upd_idx
            self._s.np["upd_val"][:k] = self._upd_val

    def _apply_updates(self) -> None:
        """Write this step's new block-table entries into the device table."""
        k = self._num_updates
        if k == 0:
            return
        if k <= self._s.max_updates:
            idx, val = self._s.t["upd_idx"][:k], self._s.t["upd_val"][:k]
        else:  # a step adopting unusually many blocks: a separate copy
            idx = torch.tensor(self._upd_idx, dtype=torch.int64).to(self.device)
            val = torch.tensor(self._upd_val, dtype=torch.int32).to(self.device)
        self._bt_flat[idx] = val

    def _eager(self, nd: int, num_tokens: int, num_seqs: int, m: int, all_logits: bool, v0=-1):  # noqa: ANN001, ANN202
        """An eager step: the emitters' logits and greedy tokens, every token's fp32 logits
        (``all_logits``), and fp32 logits of tokens ``v0:`` (the verifications'; ``v0 >= 0``)."""
        t, att = self._s.t, self.attention
        block_tables = self._bt_dev.index_select(0, t["rows"][:num_seqs])
        if nd == num_seqs:  # decode-only
            att.set_step(
                t["slot"][:nd],
                block_tables,
                t["ctx"][:nd],
                None,
                decode_num_splits(nd, att.num_kv_heads, self.max_model_len, self.device),
            )
        else:
            att.set_step(
                t["slot"][:num_tokens], block_tables, t["ctx"][:num_seqs], t["cu"][: num_seqs + 1]
            )
        hidden = self._forward(self._input_ids(num_tokens), t["pos"][:num_tokens], att)
        logits_all = self.model.compute_logits(hidden) if all_logits else None
        vlogits = None
        if v0 >= 0:
            vlogits = F.linear(hidden[v0:num_tokens], self.model.lm_head_weight).float()
        if m == 0:
            return None, None, logits_all, vlogits
        rows = t["logit"][:m]
        if logits_all is not None:
            logits = logits_all.index_select(0, rows)
        else:
            logits = F.linear(hidden.index_select(0, rows), self.model.lm_head_weight)
        return logits, logits.argmax(-1).to(torch.int32), logits_all, vlogits

    def _input_ids(self, n: int) -> torch.Tensor:
        """The step's ``n`` input ids on the device: a decode's (``src`` >= 0) is its row's last
        sampled token, any other the host's id."""
        t = self._s.t
        src = t["src"][:n]
        last = self._last_tok.index_select(0, src.clamp(min=0))
        return torch.where(src >= 0, last, t["ids"][:n])

    def _sample(self, rows: np.ndarray, emitters, logits, m: int) -> torch.Tensor:  # noqa: ANN001
        """The emitters' tokens drawn with their sampling parameters (int32, on the device)."""
        seqs = [self._seqs[r.request_id] for r in emitters]
        steps = (self._slen[rows] - np.array([s.num_prompt for s in seqs])).tolist()
        batch = SamplingBatch.from_params([s.params for s in seqs], steps, self.device)
        return sample(logits[:m].float(), batch).to(torch.int32)

    # -- verification steps (speculative decoding) -----------------------------------------------
    def _drafts(self, plan: StepPlan, limits: Sequence[int] | None, stop_ids) -> _Verifies:  # noqa: ANN001
        """Each verifying request's row, first query position and drafts (the drafter's, at
        most ``k`` and ``limit - 1``)."""
        if self.drafter is None:
            raise ValueError("ModelRunner.drafter: a plan verifies drafts but no drafter is set")
        reqs = [r for r, _ in plan.verifies]
        if limits is None:
            limits = [k + 1 for _, k in plan.verifies]
        seqs, hist = self._seqs, self._hist
        rows, starts, histories, ks = [], [], [], []
        for (r, k), limit in zip(plan.verifies, limits):
            s = seqs[r.request_id]
            row = s.row
            assert row >= 0, f"request {r.request_id} verifies without a row"
            length = int(self._len[row])
            assert length == self._slen[row] == r.num_tokens == r.num_computed_tokens + 1, (
                f"request {r.request_id}: history out of step with its verification"
            )
            rows.append(row)
            starts.append(length - 1)
            histories.append(hist[row, :length])
            ks.append(max(0, min(k, limit - 1)))
        rids = [r.request_id for r in reqs]
        on_device = getattr(self.drafter, "propose_on_device", None)
        dev = None if on_device is None else on_device(histories, ks, rids)
        if dev is None:
            proposals = self.drafter.propose_batch(histories, ks, rids)
            name = type(self.drafter).__name__
            if len(proposals) != len(reqs):
                raise RuntimeError(f"{name}.propose_batch gave {len(proposals)} for {len(reqs)}")
            drafts = [np.asarray(d[:k], dtype=np.int64) for d, k in zip(proposals, ks)]
            self._check_vocab(drafts)
        else:  # every k proposed, read back with the verification
            drafts = [np.zeros(k, dtype=np.int64) for k in ks]
        ver = _Verifies(reqs, rows, starts, drafts, limits, stop_ids)
        ver.dev = dev
        if self.acceptance is not None:  # drawn from the requests' pre-step counters
            ver.stated = self.acceptance.sample([(r, len(d)) for r, d in zip(reqs, drafts)])
        return ver

    def draft_ahead(self, requests: Sequence[Request], ks: Sequence[int]) -> None:
        """Hint the drafter (``Drafter.prefetch``) that ``requests`` will next verify ``ks``
        drafts from their histories as committed now, so it may start proposing while the
        host plans (requests with a step in flight: none)."""
        prefetch = getattr(self.drafter, "prefetch", None)
        if prefetch is None or not requests:
            return
        assert self._in_flight == 0, "drafting ahead with a step in flight"
        histories = []
        for r in requests:
            row = self._seqs[r.request_id].row
            assert row >= 0, f"request {r.request_id} drafts ahead without a row"
            histories.append(self._hist[row, : self._len[row]])
        prefetch(histories, ks, [r.request_id for r in requests])

    def _check_vocab(self, drafts: Sequence[np.ndarray]) -> None:
        vocab = self.model.config.vocab_size
        if any(len(d) and (d.min() < 0 or d.max() >= vocab) for d in drafts):
            name = type(self.drafter).__name__
            raise RuntimeError(f"{name} proposed a token outside the vocabulary [0, {vocab})")

    def _place_drafts(self, ver: _Verifies) -> None:
        """Copy drafts made on the device into the step's uploaded input ids (their places
        staged by ``_stage_verifies``)."""
        t, n = self._s.t, sum(len(d) for d in ver.drafts)
        src = t["draft_src"][:n].to(torch.int64)
        ver.flat = ver.dev.reshape(-1).index_select(0, src).to(torch.int32)
        t["ids"].index_copy_(0, t["draft_dst"][:n].to(torch.int64), ver.flat)

    def _read_verification(self, ver: _Verifies, judged: torch.Tensor) -> None:
        """Read the judgement (and drafts made on the device) back."""
        if ver.dev is None:
            ver.host = judged.cpu().numpy()
            return
        both = torch.cat([judged.reshape(-1), ver.flat]).cpu().numpy().astype(np.int64)
        ver.host = both[: 2 * ver.n].reshape(2, ver.n)
        ends = np.cumsum([len(d) for d in ver.drafts])
        ver.drafts = np.split(both[2 * ver.n :], ends[:-1])
        ver.next = verify.next_drafts(ver.drafts)
        ver.dev = ver.flat = None
        self._check_vocab(ver.drafts)

    def _stage_verifies(
        self,
        ver: _Verifies,
        verifies: Sequence[tuple[Request, int]],
        blocks_of: BlocksOf,
        t0: int,
        s0: int,
        rows_per_token: bool = False,
    ) -> np.ndarray:
        """Stage the verifications' query tokens from token ``t0`` and sequence ``s0`` on (with
        ``rows_per_token``, as decode rows from row ``t0`` on: the expanded step, each token's
        context ending at its own position); returns each token's row."""
        h, hist = self._s.np, self._hist
        q = np.array([len(d) + 1 for d in ver.drafts], dtype=np.int64)
        rows = np.array(ver.rows, dtype=np.int64)
        starts = np.array(ver.starts, dtype=np.int64)
        for (r, _), row in zip(verifies, ver.rows):
            table = blocks_of(r)
            if len(table) != self._nblk[row]:
                self._sync_row(row, table)
        ids = []
        for row, c, d in zip(ver.rows, ver.starts, ver.drafts):
            ids.append(hist[row, c : c + 1])
            ids.append(d)
        t1, s1 = t0 + ver.n, s0 + len(rows)
        ends = np.cumsum(q)
        h["ids"][t0:t1] = np.concatenate(ids)
        ver.t0 = t0
        if ver.dev is not None:  # drafts made on the device: where each goes and comes from
            k = q - 1
            nd = int(k.sum())
            s = np.arange(nd) - np.repeat(np.cumsum(k) - k, k)  # each draft's index
            h["draft_dst"][:nd] = t0 + np.repeat(ends - q + 1, k) + s
            h["draft_src"][:nd] = s * ver.dev.shape[1] + np.repeat(np.arange(len(k)), k)
        h["src"][t0:t1] = -1
        pos = np.repeat(starts - (ends - q), q) + np.arange(ver.n)
        h["pos"][t0:t1] = pos
        tok_rows = np.repeat(rows, q)
        if rows_per_token:  # causal: row i sees the request's context up to its own position
            h["ctx"][t0:t1] = pos + 1
            h["rows"][t0:t1] = tok_rows
            return tok_rows
        h["ctx"][s0:s1] = starts + q
        h["cu"][s0 + 1 : s1 + 1] = t0 + ends
        h["rows"][s0:s1] = rows
        return tok_rows

    def _judge(self, ver: _Verifies, vlogits: torch.Tensor) -> torch.Tensor:
        """``verify.judge`` on the query rows: ``[2, n]`` (accept, alt) on the device."""
        if ver.dev is None:
            ver.next = verify.next_drafts(ver.drafts)
            nxt = torch.from_numpy(ver.next).to(self.device, non_blocking=True)
        else:  # each draft follows the query row before its own
            nxt = torch.full((ver.n,), -1, dtype=torch.int64, device=self.device)
            at = self._s.t["draft_dst"][: len(ver.flat)].to(torch.int64) - (ver.t0 + 1)
            nxt.index_copy_(0, at, ver.flat.to(torch.int64))
        batch = None
        seqs = [self._seqs[r.request_id] for r in ver.requests] if self._num_sampled else []
        if any(s.params.needs_sampler for s in seqs):
            params, steps = [], []
            for s, row, d in zip(seqs, ver.rows, ver.drafts):
                g = int(self._len[row]) - s.num_prompt
                params += [s.params] * (len(d) + 1)
                steps += range(g, g + len(d) + 1)
            batch = SamplingBatch.from_params(params, steps, self.device)
        accept, alt = verify.judge(vlogits, nxt, batch)
        return torch.stack([accept, alt])

    def _verified(self, ver: _Verifies, commit: bool) -> list[list[int]]:
        """The emitted tokens of each verification; committed: appended to the rows' histories,
        their device last token marked stale and their mirrored blocks cut to what the
        scheduler keeps (``KVCacheManager.trim``: the blocks of the computed tokens)."""
        host = ver.host
        accept = host[0] if ver.stated is None else _stated_rows(ver.stated, ver.drafts)
        out = verify.resolve(accept, host[1], ver.drafts, ver.limits, ver.stop_ids, ver.next)
        if not commit:
            return out
        self.num_proposed += sum(len(d) for d in ver.drafts)
        self.num_accepted += sum(len(t) - 1 for t in out)
        rows = np.array(ver.rows, dtype=np.int64)
        e = np.array([len(t) for t in out], dtype=np.int64)
        n = self._len[rows]
        assert np.all(n + e <= self.max_model_len), "a verification past max_model_len"
        offsets = np.arange(int(e.sum())) - np.repeat(np.cumsum(e) - e, e)
        self._hist[np.repeat(rows, e), np.repeat(n, e) + offsets] = np.concatenate(out)
        self._len[rows] = self._slen[rows] = n + e
        keep = -(-(np.array(ver.starts, dtype=np.int64) + e) // self.block_size)
        self._nblk[rows] = np.minimum(self._nblk[rows], keep)
        self._stale.update(ver.rows)
        return out

    # -- decode-only steps: CUDA graphs ------------------------------------------------------------
    def _decode_forward(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A padded decode step of ``b`` rows on the persistent buffers (what a graph captures)."""
        t, att = self._s.t, self.attention
        block_tables = self._bt_dev.index_select(0, t["rows"][:b])
        splits = decode_num_splits(b, att.num_kv_heads, self.max_model_len, self.device)
        att.set_step(t["slot"][:b], block_tables, t["ctx"][:b], None, splits)
        src = t["src"][:b]  # the decodes' rows (padding: the sink)
        hidden = self._forward(self._last_tok.index_select(0, src), t["pos"][:b], att)
        logits = F.linear(hidden, self.model.lm_head_weight)
        tokens = logits.argmax(-1).to(torch.int32)
        self._last_tok[src] = tokens  # the next step's inputs, before the host sees them
        return logits, tokens

    def _decode_step(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.cuda_graphs:
            return self._decode_forward(b)
        graph, out = self._graphs[b]
        graph.replay()
        return out

    # -- mixed steps: CUDA graphs keyed by padded token count ------------------------------------
    def _mixed_forward(self, tokens: int) -> torch.Tensor:
        """A padded mixed step of ``tokens`` tokens and ``max_num_seqs + 1`` sequences; returns
        the final hidden states of every token (what a mixed graph captures)."""
        t, att, s = self._s.t, self.attention, self.max_num_seqs + 1
        block_tables = self._bt_dev.index_select(0, t["rows"][:s])
        att.set_step(t["slot"][:tokens], block_tables, t["ctx"][:s], t["cu"][: s + 1])
        return self._forward(self._input_ids(tokens), t["pos"][:tokens], att)

    def _mixed_step(self, tokens: int, m: int, v0: int = -1, v1: int = 0):  # noqa: ANN202
        """A padded mixed step: the emitters' logits and greedy tokens, and fp32 logits of
        tokens ``v0:v1`` (the verifications'; ``v0 >= 0``)."""
        if self.mixed_graphs:
            graph, hidden = self._mixed[tokens]
            graph.replay()
        else:
            hidden = self._mixed_forward(tokens)
        return self._head(hidden, m, v0, v1)

    def _head(self, hidden: torch.Tensor, m: int, v0: int, v1: int):  # noqa: ANN202
        """Logits of a step's final hidden states: the emitters' (rows ``logit[:m]``) and their
        greedy tokens, and fp32 logits of rows ``v0:v1`` (``v0 >= 0``)."""
        vlogits = None
        if v0 >= 0:
            vlogits = F.linear(hidden[v0:v1], self.model.lm_head_weight).float()
        if m == 0:
            return None, None, vlogits
        logits = F.linear(hidden.index_select(0, self._s.t["logit"][:m]), self.model.lm_head_weight)
        return logits, logits.argmax(-1).to(torch.int32), vlogits

    # -- verification steps as decode rows: CUDA graphs keyed by padded row count --------------
    def _verify_forward(self, b: int) -> torch.Tensor:
        """A padded expanded verification step of ``b`` decode rows (the decodes' ids read on
        the device, the verifications' staged); returns every row's final hidden states (what
        a verification graph captures)."""
        t, att = self._s.t, self.attention
        block_tables = self._bt_dev.index_select(0, t["rows"][:b])
        splits = decode_num_splits(b, att.num_kv_heads, self.max_model_len, self.device)
        att.set_step(t["slot"][:b], block_tables, t["ctx"][:b], None, splits)
        return self._forward(self._input_ids(b), t["pos"][:b], att)

    def _verify_step(self, b: int, m: int, v0: int, v1: int):  # noqa: ANN202
        """An expanded verification step: as ``_mixed_step``, over ``b`` decode rows."""
        if self.cuda_graphs:
            graph, hidden = self._verify[b]
            graph.replay()
        else:
            hidden = self._verify_forward(b)
        return self._head(hidden, m, v0, v1)

    def _capture_verify(self, b: int) -> None:
        self._pad(0, b)  # capture on padding rows: no KV is written, nothing is read
        self._verify[b] = self._graph_of(lambda: self._verify_forward(b))

    def _capture_mixed(self, tokens: int) -> None:
        self._pad_mixed(0, tokens, 0)  # capture on padding only: no KV is written or read
        self._mixed[tokens] = self._graph_of(lambda: self._mixed_forward(tokens))

    def _graph_of(self, forward):  # noqa: ANN001, ANN202
        """Capture ``forward()`` (staged inputs uploaded first; a first eager call compiles the
        kernels outside the capture) into a graph of the shared pool: ``(graph, outputs)``."""
        self._s.upload()
        forward()
        torch.cuda.synchronize(self.device)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = forward()
        torch.cuda.synchronize(self.device)
        return graph, out

    def decode_graph(self, b: int) -> torch.cuda.CUDAGraph | None:
        """The captured decode graph of bucket ``b`` (None if not captured), e.g. to time it."""
        entry = self._graphs.get(b)
        return None if entry is None else entry[0]

    @torch.no_grad()
    def capture_graphs(
        self, sizes: Sequence[int] | None = None, mixed: bool = True, verify_rows: int = 0
    ) -> None:
        """Capture the decode graphs of ``sizes`` (default: every bucket), with ``mixed`` every
        mixed-step graph and (with ``verify_as_decode``) the expanded verification graphs of the
        buckets up to the one of ``verify_rows`` rows, largest first so the smaller ones reuse
        its memory. Without it, each is captured on first use (a step that pays for it)."""
        if not self.cuda_graphs:
            return
        if mixed and self.mixed_graphs:
            for n in sorted(self.mixed_token_buckets, reverse=True):
                if n not in self._mixed:
                    self._capture_mixed(n)
        if verify_rows > 0 and self.verify_as_decode:
            top = bucket_of(min(verify_rows, self.verify_buckets[-1]), self.verify_buckets)
            for n in sorted((b for b in self.verify_buckets if b <= top), reverse=True):
                if n not in self._verify:
                    self._capture_verify(n)
        for b in sorted(sizes or self.graph_batch_sizes, reverse=True):
            if b not in self._graphs:
                self._capture(b)

    def _capture(self, b: int) -> None:
        self._pad(0, b)  # capture on padding rows: no KV is written, nothing is read
        self._graphs[b] = self._graph_of(lambda: self._decode_forward(b))


def _stated_rows(accepted: np.ndarray, drafts: Sequence[np.ndarray]) -> np.ndarray:
    """Per query row, whether its next draft is accepted when request ``j`` accepts its first
    ``accepted[j]`` drafts (the ``accept`` of ``verify.judge``'s layout)."""
    q = np.array([len(d) + 1 for d in drafts], dtype=np.int64)
    offsets = np.arange(int(q.sum())) - np.repeat(np.cumsum(q) - q, q)
    return (offsets < np.repeat(accepted, q)).astype(np.int32)


def _prompt_ids(request: Request) -> Sequence[int]:
    if request.prompt_token_ids is None:
        raise ValueError(
            f"request {request.request_id} has no prompt_token_ids (give the runner a prompt_of)"
        )
    return request.prompt_token_ids
