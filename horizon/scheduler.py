"""The scheduler: one set of mechanics under every policy and backend.

Each step: (1) running decodes get the block their next token needs, preempting by recompute
when the pool is dry (the policy picks the victim); (2) running prefills take chunks of the
remaining token budget; (3) waiting requests are admitted in the policy's order while budget,
``max_num_seqs``, blocks and the policy's gate allow. Decodes come first and each costs one token,
so prefills never starve them.

Two step modes give identical records (a test compares them byte for byte):

* ``reference``: every running request is visited every step; counters advance one by one.
* ``event``: a step touches a request only when something happens to it. Decoding requests'
  counters are *anchored* to the step clock (see ``Request``), their next block boundary sits in
  a calendar keyed by step, the decode set's tuple and its total context are kept incrementally.
  A step then costs O(events), not O(running requests).

Speculative decoding (``SchedulerConfig.speculation``; off by default, and then none of what
follows runs). Each step, before decodes grow, the speculation policy
(``horizon.speculation``) says how many draft tokens ``k`` each decoding request proposes;
``k`` is capped by the request's output limit and by the token budget (each speculating
request costs ``k + 1`` tokens, before any prefill chunk). A speculating request gets the block
of its next token as any decode does (preempting if the pool is dry) and then blocks for its
drafts from free, unreserved blocks only (its ``k`` shrinks to what fits; at 0 it decodes
plainly): speculation never preempts. It is planned as a *verify* ``(request, k)``; the
backend reports how many drafts were accepted, ``update`` advances the request by that plus
one token and trims the blocks the rejected drafts used (``KVCacheManager.trim``). In event
mode a speculating request leaves the anchored decode set (its counters settle and advance
explicitly) and returns to it at the first step it does not speculate, so steps without
speculation stay O(events). Given the backend's draws (``draws``: the simulator's) and a
``steady`` speculation policy, event mode draws each speculating request's accepted counts
ahead instead (``horizon.drawn_speculation``): its counters follow a track of drawn steps,
and steps with speculation stay O(events) too, with the same plans and records.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

from horizon.block_pool import BlockPool
from horizon.drawn_speculation import DrawnSpeculation
from horizon.kv_cache import KVCacheManager, KVView, ReservationLedger
from horizon.plan import StepPlan, StepResult, new_plan
from horizon.policies.base import Policy
from horizon.policies.speculation import make_speculation_policy
from horizon.recorder import Recorder
from horizon.request import Request, RequestStatus, StepClock
from horizon.scheduler_config import SchedulerConfig
from horizon.spec_tracks import DrawSource


def _chunk(remaining: int, emitted: int, budget: int) -> int:
    """Tokens of a prefill chunk. A recompute prefill (``emitted > 0``) never stops one token
    short of its end: that state would be a decode that has not emitted, which the counters
    cannot tell from a real decode. Costs at most one token of budget, rarely."""
    n = min(remaining, budget)
    if emitted and n == remaining - 1:
        n -= 1
    return n


def _admit_order(r: Request) -> int:
    return r.admit_seq


REJECT_MAX_MODEL_LEN = "exceeds_max_model_len"
REJECT_KV_POOL = "exceeds_kv_pool"


def never_fits_reason(req: Request, block_size: int, num_blocks: int, max_model_len: int) -> str:
    """Why ``req`` could never run on a pool of ``num_blocks`` blocks of ``block_size`` tokens
    with ``max_model_len`` ("" if it could): prompt + output cap over the model length, or
    more blocks than the pool has. ``Scheduler.add`` rejects with this reason; proxies of a
    remote scheduler ask the same rule."""
    total = req.num_prompt_tokens + req.max_output_tokens
    if total > max_model_len:
        return REJECT_MAX_MODEL_LEN
    if -(-total // block_size) > num_blocks:
        return REJECT_KV_POOL
    return ""


class Scheduler:
    """``add(request)``, ``schedule(now) -> StepPlan``, ``update(plan, result, now)``.

    Contracts:
        * ``schedule`` allocates every block the plan needs; a backend only computes.
        * ``update`` must be called with the plan of the latest ``schedule``, once.
        * A request that can never run is rejected (reported in the next plan and the records),
          never dropped.
    """

    # Slots: more instance attributes than CPython's shared-key instance dicts hold (30), whose
    # attribute reads would then be dict lookups on every step's hot path.
    __slots__ = (
        "config",
        "policy",
        "pool",
        "kv",
        "ledger",
        "running",
        "clock",
        "view",
        "recorder",
        "_event",
        "_bs",
        "_waiting",
        "_seq",
        "_admit_seq",
        "_prefilling",
        "_decoding",
        "_decode_tuple",
        "_ctx_base",
        "_longest_drift",
        "_residue",
        "_rejected",
        "_last_plan_step",
        "_now",
        "queued_prefill_tokens",
        "tokens_emitted",
        "_handed",
        "_new_handoffs",
        "_importing",
        "_ready",
        "_aborting",
        "_aborted",
        "num_aborted",
        "speculation",
        "_speculating",
        "_step_drafts",
        "num_drafted",
        "num_accepted",
        "_verify_context",
        "_drawn",
    )

    def __init__(
        self,
        config: SchedulerConfig,
        policy: Policy,
        recorder: Recorder | None = None,
        draws: DrawSource | None = None,
    ):
        """``draws``: what the backend accepts at speculating requests' output positions, when
        it accepts exactly that (``horizon.spec_tracks.DrawSource``; see the module docstring)."""
        self.config = config
        self.policy = policy
        self.pool = BlockPool(config.num_blocks, config.block_size)
        self.kv = KVCacheManager(self.pool, config.enable_prefix_caching)
        self.ledger = ReservationLedger()
        self.running: dict[int, Request] = {}  # admission order
        self.clock = StepClock()
        self.view = KVView(self.kv, self.ledger, self.running, self.clock)
        self.recorder = recorder or Recorder(config.num_blocks, config.block_size)
        self._event = config.step_mode == "event"
        self._bs = config.block_size
        self._waiting: list[tuple[object, int, Request]] = []  # heap of (key, seq, request)
        self._seq = 0
        self._admit_seq = 0
        self._prefilling: dict[int, Request] = {}  # running, in prefill (admission order)
        self._decoding: dict[int, Request] = {}  # event mode: running, in decode (anchored)
        self._decode_tuple: tuple[Request, ...] | None = ()
        self._ctx_base = 0  # event mode: sum over decoding of (C - clock.step), see plan
        # event mode: max over decoding of (C - clock.step); None: to compute again
        self._longest_drift: int | None = 0
        # event mode: decoding requests by (C - clock.step) % block_size, see _grow_decodes
        self._residue: list[dict[int, Request]] = [{} for _ in range(config.block_size)]
        self._rejected: list[tuple[Request, str]] = []
        self._last_plan_step = -1
        self._now = 0.0
        # prompt (and recompute) tokens still to compute: waiting requests' and running
        # prefills' remaining tokens (what a router reads as a replica's queued prefill)
        self.queued_prefill_tokens = 0
        self.tokens_emitted = 0  # output tokens emitted by every step so far
        # disaggregation (see the section below): prefilled requests holding their blocks here
        # until their KV is transferred; and, on a decode replica, requests whose blocks are
        # reserved for a transfer in flight (importing) or whose KV has arrived (ready)
        self._handed: dict[int, Request] = {}
        self._new_handoffs: list[tuple[Request, float]] = []  # with the update's time
        self._importing: dict[int, Request] = {}
        self._ready: deque[Request] = deque()
        # aborts (see ``abort``): running requests to finish at the end of the pending update,
        # and aborted requests not yet taken by the backend
        self._aborting: set[int] = set()
        self._aborted: list[Request] = []
        self.num_aborted = 0
        self._init_speculation(draws)

    def _init_speculation(self, draws: DrawSource | None) -> None:
        # speculation (see the module docstring): the policy, or None when off; in event mode
        # the decoding requests that verified drafts at their latest step (counters settled);
        # this step's drafts (request id -> k); totals of drafts proposed and accepted; the
        # drawn-ahead mechanics, when they apply
        spec = self.config.speculation
        self.speculation = None if spec is None else make_speculation_policy(spec)
        self._speculating: dict[int, Request] = {}
        self._step_drafts: dict[int, int] = {}
        self.num_drafted = 0
        self.num_accepted = 0
        self._verify_context = 0  # the latest update's verifies' contexts, for its record
        steady = self.speculation is not None and self.speculation.steady
        self._drawn: DrawnSpeculation | None = None
        if draws is not None and self._event and steady:
            self._drawn = DrawnSpeculation(self, draws)

    @property
    def draws_ahead(self) -> bool:
        """Whether speculating requests' acceptance is drawn ahead (see ``__init__``)."""
        return self._drawn is not None

    # -- arrivals --------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """Queue an arriving request, or reject it (with a reason) if it can never run."""
        if req.status is not RequestStatus.WAITING or req.num_output_tokens:
            raise ValueError(f"request {req.request_id} was already scheduled")
        self.recorder.arrive(req)
        reason = self._never_fits(req)
        if reason:
            req.status = RequestStatus.REJECTED
            self.recorder.reject(req, reason)
            self._rejected.append((req, reason))
            return
        self._enqueue(req, req.arrival_time)

    def never_fits(self, req: Request) -> str:
        """Why ``req`` could never run here ("" if it could): the reason ``add`` rejects with."""
        return self._never_fits(req)

    def _never_fits(self, req: Request) -> str:
        cfg = self.config
        return never_fits_reason(req, self._bs, cfg.num_blocks, cfg.max_model_len)

    def _enqueue(self, req: Request, now: float) -> None:
        req.status = RequestStatus.WAITING
        self.queued_prefill_tokens += req.num_tokens_to_compute - req.handoff
        heapq.heappush(self._waiting, (self.policy.waiting_key(req, now), self._seq, req))
        self._seq += 1

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self._ready)

    @property
    def num_unfinished(self) -> int:
        """Waiting plus running requests (a router's load): ``num_waiting + len(running)``."""
        return len(self._waiting) + len(self._ready) + len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self._waiting or self._ready)

    # -- schedule --------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        """Plan the next step at time ``now``; allocates its blocks, may preempt."""
        t = self.clock.step
        assert self._last_plan_step < t, "update() was not called for the previous plan"
        self._last_plan_step = t
        self._now = now
        preempted: list[Request] = []
        every = self.policy.refresh_every
        refreshed = 0
        if every and t % every == 0 and self.running:
            refreshed = len(self.running)
            self._refresh(now)
        event, max_tokens, spec = self._event, self.config.max_num_batched_tokens, self.speculation
        drafts = self._drafts(t) if spec is not None else None
        self._grow_decodes(t, preempted)
        budget = max_tokens - (len(self._decoding) if event else self._count_decodes())
        verifies: list[tuple[Request, int]] | tuple[()] = ()
        if spec is not None:
            budget, verifies = self._verifies(t, drafts, budget, preempted)
        prefills: list[tuple[Request, int]] = []
        if self._prefilling:
            budget = self._schedule_prefills(budget, prefills, preempted)
        if self._ready:
            budget = self._admit_imports(now, budget, prefills)
        if self._waiting:
            self._admit(now, budget, prefills)
        if preempted:  # a victim may have been given a chunk earlier in this step
            prefills = [(r, n) for r, n in prefills if r.status is RequestStatus.RUNNING]
            if verifies:  # a victim re-admitted in this step runs again, but not its verify
                gone = {id(r) for r in preempted}
                verifies = [(r, k) for r, k in verifies if id(r) not in gone]
        decodes, decode_context, longest = self._step_decodes(t, verifies)
        step_verifies = tuple(verifies) if verifies else ()
        if spec is not None and self._drawn is not None:
            step_verifies = self._drawn.verifies(t)  # type: ignore[assignment]
        rejected = ()
        if self._rejected:
            rejected, self._rejected = tuple(self._rejected), []
        chunk_tokens, pairs, context = _chunk_shape(prefills)
        return new_plan(
            t,
            now,
            decodes,
            tuple(prefills),
            tuple(preempted) if preempted else (),
            rejected,
            chunk_tokens,
            decode_context,
            pairs,
            context,
            len(self.running),
            len(self._waiting) + len(self._ready),  # num_waiting
            self.pool.num_used,
            max_tokens,
            refreshed,
            step_verifies,
            longest,
        )

    def _drafts(self, t: int) -> dict[int, int] | None:
        """This step's drafts (speculation on), before decodes grow; drawn ahead: chosen in
        ``_drawn`` (None here)."""
        if self._drawn is not None:
            self._drawn.choose(t)
            return None
        return self._choose_drafts()

    def _verifies(
        self, t: int, drafts: dict[int, int] | None, budget: int, preempted: list[Request]
    ) -> tuple[int, list[tuple[Request, int]]]:
        """Blocks for this step's drafts (speculation on): the budget left and the verifies
        (drawn ahead: kept in ``_drawn``, none here)."""
        verifies: list[tuple[Request, int]] = []
        if self._drawn is not None:
            return self._drawn.plan(t, budget, preempted), verifies
        if drafts:
            budget = self._plan_verifies(drafts, budget, verifies, preempted)
        return budget, verifies

    def _step_decodes(self, t: int, verifies) -> tuple[tuple[Request, ...], int, int]:  # noqa: ANN001
        """The step's plain decodes (not verifying), their context tokens and the longest
        one's; in event mode the anchored set's tuple, kept until it changes, its context in
        O(1) and its longest in O(1) but after the longest one leaves (a scan then)."""
        if self._event:
            decodes = self._decode_tuple
            if decodes is None:
                decodes = self._decode_tuple = tuple(self._decoding.values())
            if not decodes:
                return decodes, 0, 0
            return decodes, self._ctx_base + len(decodes) * t, self._longest_now() + t
        decodes = self._decodes()
        if verifies:
            verifying = {r.request_id for r, _ in verifies}
            decodes = tuple(r for r in decodes if r.request_id not in verifying)
        contexts = [r.num_computed_tokens for r in decodes]
        return decodes, sum(contexts), max(contexts, default=0)

    def _longest_now(self) -> int:
        """Event mode: the largest (C - clock.step) over the anchored set (0 when empty)."""
        if self._longest_drift is None:
            step = self.clock.step
            self._longest_drift = max(
                (r.num_computed_tokens - step for r in self._decoding.values()), default=0
            )
        return self._longest_drift

    def _refresh(self, now: float) -> None:
        """Let the policy revise its estimates, then re-read running requests' reservations."""
        self.policy.refresh(self.view, now)
        bs, kv, ledger, reserve = self._bs, self.kv, self.ledger, self.policy.reserve_tokens
        for r in self.running.values():
            ledger.set(r.request_id, -(-reserve(r) // bs), len(kv.blocks_of(r)))
        if self.policy.dynamic_order and self._waiting:
            reqs = [r for _, _, r in self._waiting]
            keys = self.policy.rank_waiting(reqs, self.view, now)
            if len(keys) != len(reqs):
                raise RuntimeError(
                    f"{type(self.policy).__name__}.rank_waiting returned {len(keys)} keys "
                    f"for {len(reqs)} waiting requests"
                )
            self._waiting = [(k, seq, r) for k, (_, seq, r) in zip(keys, self._waiting)]
            heapq.heapify(self._waiting)

    def _count_decodes(self) -> int:
        return sum(1 for r in self.running.values() if r.is_decode)

    def _decodes(self) -> tuple[Request, ...]:
        if not self._event:
            return tuple(r for r in self.running.values() if r.is_decode)
        if self._decode_tuple is None:
            self._decode_tuple = tuple(self._decoding.values())
        return self._decode_tuple

    def _decode_context(self, decodes: Sequence[Request], t: int) -> int:
        if self._event:
            return self._ctx_base + len(decodes) * t
        return sum(r.num_computed_tokens for r in decodes)

    def _grow_decodes(self, t: int, preempted: list[Request]) -> None:
        """Give each decode whose next token starts a new block that block, in admission order
        (the order only matters when the pool runs dry, so event mode sorts only then)."""
        if not self._event:
            spec = self._step_drafts  # speculating requests grow in _plan_verifies
            for r in [
                r
                for r in self.running.values()
                if r.is_decode and r.request_id not in spec and self.kv.num_blocks_needed(r, 1)
            ]:
                if r.status is RequestStatus.RUNNING:  # else preempted earlier in this loop
                    self._allocate(r, 1, preempted)
            return
        # A decoding request's C grows with the clock, so C % bs == 0 exactly when
        # (C - clock) % bs == -t % bs: one residue class is due at each step.
        cls = self._residue[-t % self._bs]
        if not cls:
            return
        due = list(cls.values())
        if self.kv.append_one_each(due):
            if self.ledger.active:
                for r in due:
                    self.ledger.grew(r.request_id, 1)
            return
        due.sort(key=_admit_order)
        for r in due:
            if r.status is RequestStatus.RUNNING:  # else preempted earlier in this loop
                self._allocate(r, 1, preempted)

    def _schedule_prefills(
        self, budget: int, prefills: list[tuple[Request, int]], preempted: list[Request]
    ) -> int:
        """Chunks for running requests still in prefill, in admission order."""
        for r in list(self._prefilling.values()):
            if budget <= 0:
                break
            if r.status is not RequestStatus.RUNNING:
                continue  # preempted as a victim in this loop
            n = _chunk(r.num_tokens_to_compute - r.handoff, r.num_output_tokens, budget)
            if n == 0:
                continue
            if not self._allocate(r, self.kv.num_blocks_needed(r, n), preempted):
                break
            prefills.append((r, n))
            budget -= n
        return budget

    def _admit(self, now: float, budget: int, prefills: list[tuple[Request, int]]) -> None:
        """Start waiting requests in policy order until budget, seats, blocks or gate run out."""
        bs, kv, waiting = self._bs, self.kv, self._waiting
        max_seqs = self.config.max_num_seqs
        while budget > 0 and waiting and len(self.running) < max_seqs:
            r = waiting[0][2]
            if not self.policy.admit(r, self.view):
                break
            hit = kv.prefix_hit(r)
            cached = len(hit) * bs
            n = _chunk(r.num_tokens - cached - r.handoff, r.num_output_tokens, budget)
            if n == 0:
                break
            need = -(-(cached + n) // bs) - len(hit)
            if need > self.pool.num_free_after_adopting(hit):
                break
            heapq.heappop(waiting)
            if hit:
                kv.adopt(r, hit)
            if need:
                kv.allocate(r, need)
            r.set_computed(cached)
            self.queued_prefill_tokens -= cached
            self._start(r)
            self.recorder.admit(r, now, cached)
            prefills.append((r, n))
            budget -= n

    def _start(self, r: Request) -> None:
        """``r`` (its blocks allocated) starts running in prefill, with its reservation."""
        r.status = RequestStatus.RUNNING
        r.admit_seq = self._admit_seq
        self._admit_seq += 1
        self.running[r.request_id] = r
        self._prefilling[r.request_id] = r
        reserve = self.policy.reserve_tokens(r)
        if reserve:
            self.ledger.add(r.request_id, -(-reserve // self._bs), len(self.kv.blocks_of(r)))

    def _allocate(self, r: Request, k: int, preempted: list[Request]) -> bool:
        """Give ``r`` ``k`` more blocks, preempting policy-chosen victims until it fits.
        False if ``r`` itself was chosen (it is then back in the waiting queue)."""
        while not self.kv.allocate(r, k):
            victim = self.policy.choose_victim(tuple(self.running.values()), r, self._now)
            self._preempt(victim, preempted)
            if victim is r:
                return False
        if k:
            self.ledger.grew(r.request_id, k)
        return True

    def _preempt(self, r: Request, preempted: list[Request]) -> None:
        rid = r.request_id
        if self._event and rid in self._decoding:
            self.recorder.close_run(r, self.clock.step - 1)
        if rid in self._prefilling:
            self.queued_prefill_tokens -= r.num_tokens_to_compute - r.handoff
        self._remove_running(r)
        r.reset_for_recompute(0)
        self._enqueue(r, self._now)
        preempted.append(r)

    def _remove_running(self, r: Request) -> None:
        rid = r.request_id
        if rid in self._decoding:  # as _unanchor, inlined: once per request that finishes
            drift = r.num_computed_tokens - self.clock.step
            self._ctx_base -= drift
            if drift == self._longest_drift:
                self._longest_drift = None
            del self._decoding[rid]
            del self._residue[drift % self._bs][rid]
            self._decode_tuple = None
            r.settle()
        elif self._speculating:
            if self._drawn is not None:
                self._drawn.forget(r)
            self._speculating.pop(rid, None)
        del self.running[rid]
        self._prefilling.pop(rid, None)
        self.ledger.drop(rid)
        self.kv.free(r, keep_hashes=True)

    def _unanchor(self, r: Request) -> None:
        """Event mode: take a decoding request out of the anchored set, its counters settled."""
        rid = r.request_id
        drift = r.num_computed_tokens - self.clock.step
        self._ctx_base -= drift
        if drift == self._longest_drift:
            self._longest_drift = None
        del self._decoding[rid]
        del self._residue[drift % self._bs][rid]
        self._decode_tuple = None
        r.settle()

    # -- speculation -----------------------------------------------------------------------------
    def _choose_drafts(self) -> dict[int, int]:
        """This step's drafts, request id -> k >= 1, from the speculation policy, capped by
        each request's output limit and the token budget; in event mode, moves requests into
        and out of the anchored decode set to match."""
        if self._event:
            cands = self._decodes()
            if self._speculating:
                cands = cands + tuple(self._speculating.values())
        else:
            cands = tuple(r for r in self.running.values() if r.is_decode)
        drafts: dict[int, int] = {}
        if cands:
            assert self.speculation is not None
            ks = self.speculation.draft_tokens(cands, self.view)
            n = len(cands)
            avail = self.config.max_num_batched_tokens - n  # tokens left for drafts
            if isinstance(ks, int):
                ks = (ks,) * n
            elif len(ks) != n:
                raise RuntimeError(
                    f"{type(self.speculation).__name__}.draft_tokens returned {len(ks)} counts "
                    f"for {n} decoding requests"
                )
            # over the budget, every request's drafts are capped alike
            room = avail if sum(k for k in ks if k > 0) <= avail else avail // n
            for r, k in zip(cands, ks):
                k = min(k, room, r.max_output_tokens - r.num_output_tokens - 1)
                if k > 0:
                    drafts[r.request_id] = k
        if self._event:
            self._match_speculating(drafts)
        self._step_drafts = drafts
        return drafts

    def _match_speculating(self, drafts: dict[int, int]) -> None:
        """Event mode: requests with drafts leave the anchored set, the others rejoin it."""
        spec = self._speculating
        for rid in [rid for rid in spec if rid not in drafts]:
            self._enter_decode(spec.pop(rid))
        rec, t = self.recorder, self.clock.step
        for rid in drafts:
            if rid not in spec:
                r = self._decoding[rid]
                rec.close_run(r, t - 1)  # it emitted at every step through the last
                self._unanchor(r)
                spec[rid] = r

    def _next_token_blocks(self, reqs: list[Request], total: int, preempted: list[Request]) -> bool:
        """The speculating requests' next tokens' blocks, ``total`` the blocks their
        verifications need: when that is more than the free unreserved blocks, in admission
        order (``reqs`` sorted so) preempting as decodes do, and True; else as they come."""
        kv, ledger = self.kv, self.ledger
        if total > self.pool.num_free - ledger.outstanding:
            reqs.sort(key=_admit_order)
            for r in reqs:
                need = kv.num_blocks_needed(r, 1)
                if need and r.status is RequestStatus.RUNNING:
                    self._allocate(r, need, preempted)
            return True
        for r in reqs:
            need = kv.num_blocks_needed(r, 1)
            if need:
                kv.allocate(r, need)
                ledger.grew(r.request_id, need)
        return False

    def _plan_verifies(
        self,
        drafts: dict[int, int],
        budget: int,
        verifies: list[tuple[Request, int]],
        preempted: list[Request],
    ) -> int:
        """Blocks for the speculating requests' next tokens (preempting, as decodes do) and
        for their drafts (free unreserved blocks only, shrinking ``k``); fills ``verifies``
        and returns the budget left. Admission order when the pool is short."""
        kv, pool, ledger, bs = self.kv, self.pool, self.ledger, self._bs
        if self._event:
            budget -= len(self._speculating)
            reqs = list(self._speculating.values())
        else:
            reqs = [r for r in self.running.values() if r.request_id in drafts]
        total = sum(kv.num_blocks_needed(r, drafts[r.request_id] + 1) for r in reqs)
        self._next_token_blocks(reqs, total, preempted)
        for r in reqs:
            if r.status is not RequestStatus.RUNNING:
                continue  # preempted above
            c, held = r.num_computed_tokens, len(kv.blocks_of(r))
            spare = max(0, pool.num_free - ledger.outstanding)
            k = min(drafts[r.request_id], (held + spare) * bs - c - 1)
            if k <= 0:  # no block for a draft: a plain decode this step
                if self._event:
                    del self._speculating[r.request_id]
                    self._enter_decode(r)
                continue
            n = -(-(c + k + 1) // bs) - held
            ok = kv.allocate_drafts(r, n)
            assert ok, "draft blocks were counted free"
            if n:
                ledger.grew(r.request_id, n)
            verifies.append((r, k))
            budget -= k
        return budget

    def _verified(self, plan: StepPlan, result: StepResult, t: int) -> None:
        """Account the plan's verifications: each request advances by its accepted drafts
        plus one token, emitted at step ``t``; rejected drafts' blocks are trimmed."""
        acc = result.accepted
        if len(acc) != len(plan.verifies):
            raise RuntimeError(
                f"StepResult.accepted has {len(acc)} counts for {len(plan.verifies)} verifications"
            )
        rec, kv, ledger = self.recorder, self.kv, self.ledger
        emitted = drafted = context = 0
        for (r, k), a in zip(plan.verifies, acc):
            context += r.num_computed_tokens
            a = int(a)
            assert 0 <= a <= k, f"request {r.request_id}: {a} of {k} drafts accepted"
            for _ in range(a + 1):
                r.advance(1)
                rec.decode(r, t)
            emitted += a + 1
            drafted += k
            trimmed = kv.trim(r)
            if trimmed:
                ledger.grew(r.request_id, -trimmed)
        self._verify_context = context  # recorded with the step
        self.tokens_emitted += emitted
        self.num_drafted += drafted
        self.num_accepted += emitted - len(plan.verifies)
        assert self.speculation is not None
        self.speculation.observe(plan.verifies, acc)

    # -- update ----------------------------------------------------------------------------------
    def update(self, plan: StepPlan, result: StepResult, now: float) -> None:
        """Account the executed ``plan``: advance counters, emit tokens, finish requests."""
        t = plan.step
        assert t == self.clock.step == self._last_plan_step, "update() out of order"
        rec, event = self.recorder, self._event
        verifies = plan.verifies
        entered = self._advance_prefills(plan.prefills, t, now) if plan.prefills else ()
        self.queued_prefill_tokens -= plan.num_prefill_tokens
        self.tokens_emitted += len(plan.decodes) + len(entered)
        if verifies and self._drawn is None:
            self._verified(plan, result, t)
        if not event:
            for r in plan.decodes:
                r.advance(1)
                rec.decode(r, t)
        self.clock.step = t + 1
        if self._drawn is not None:  # its requests' counters advanced with the clock
            self._drawn.verified(plan, result, t)
        if entered and event:
            for r in entered:
                self._enter_decode(r)
        decoding = self._decoding
        for r in result.finished:
            if event and r.request_id in decoding:
                rec.close_run(r, t)
            self._remove_running(r)
            assert r.num_output_tokens <= r.max_output_tokens
            r.status = RequestStatus.FINISHED
            rec.finish(r)
        if self._aborting:
            self._abort_requested()
        rec.step(
            plan.time,
            now,
            plan.num_prefill_tokens,
            # a verifying request is recorded as a decode over its context
            len(plan.decodes) + len(verifies) if verifies else len(plan.decodes),
            len(self.running),
            len(self._waiting),
            self.pool.num_used,
            plan.token_budget,
            len(plan.prefills),
            plan.decode_context_tokens + self._verify_context
            if verifies
            else plan.decode_context_tokens,
            plan.prefill_context_tokens,
            plan.prefill_attention_pairs,
            plan.num_refreshed,
            len(plan.preempted),
        )

    def _advance_prefills(
        self, prefills: tuple[tuple[Request, int], ...], t: int, now: float
    ) -> list[Request]:
        """Advance the step's chunks (recorded, their blocks' hashes registered); a chunk that
        ends its prefill emits the first token. Returns the requests that entered decoding; a
        handoff request whose prompt is computed is handed off."""
        rec, register, prefilling = self.recorder, self.kv.register_computed, self._prefilling
        entered = []
        for r, n in prefills:
            rec.compute(r, r.num_computed_tokens, n)
            if r.advance(n):
                rec.emit(r, t)
                del prefilling[r.request_id]
                entered.append(r)
            register(r)
            if r.handoff and r.num_tokens_to_compute == 1:
                self._hand_off(r, now)
        return entered

    def _abort_requested(self) -> None:
        """Abort the running requests ``abort`` marked (those still running)."""
        for rid in sorted(self._aborting):  # a fixed order: the free queue's
            r = self.running.get(rid)
            if r is not None:  # else it finished in this very step
                self._abort_running(r)
        self._aborting.clear()

    def _enter_decode(self, r: Request) -> None:
        """Event mode: anchor a request that just finished its prefill."""
        r.anchor(self.clock)
        self._decoding[r.request_id] = r
        self._decode_tuple = None
        drift = r.num_computed_tokens - self.clock.step
        self._ctx_base += drift
        if self._longest_drift is not None and (
            len(self._decoding) == 1 or drift > self._longest_drift
        ):
            self._longest_drift = drift
        self._residue[drift % self._bs][r.request_id] = r
        if self._drawn is not None:
            self._drawn.entered(r)

    # -- aborts --------------------------------------------------------------------------------
    def abort(self, request_id: int) -> bool:
        """Stop request ``request_id`` for good (its client went away); idempotent.

        A waiting request leaves the queue at once. A running one is finished at a step
        boundary: at once when no plan is pending (``update`` was called for the latest
        ``schedule``), else at the end of that plan's ``update``. Its blocks are freed (full
        prompt blocks stay in the prefix cache), its reservation dropped, its status set to
        FINISHED; its record stays unfinished, with the tokens it emitted. The backend learns
        of it through ``take_aborted``. ``num_aborted`` counts aborts.

        Returns:
            True if the request was waiting or running here (now aborted or to be at the
            pending update), False for an id that is unknown, finished, rejected or already
            aborted.

        Raises:
            ValueError: the request is in a KV transfer (disaggregation), which cannot be
                aborted.
        """
        if (
            request_id in self._handed
            or request_id in self._importing
            or any(r.request_id == request_id for r in self._ready)
        ):
            raise ValueError(f"request {request_id} is in a KV transfer: it cannot be aborted")
        r = self.running.get(request_id)
        if r is not None:
            if request_id in self._aborting:
                return False
            if self._last_plan_step == self.clock.step:  # a plan is pending: at its update
                self._aborting.add(request_id)
            else:
                self._abort_running(r)
            return True
        for i, (_, _, w) in enumerate(self._waiting):
            if w.request_id == request_id:
                self._waiting[i] = self._waiting[-1]
                self._waiting.pop()
                heapq.heapify(self._waiting)
                self.queued_prefill_tokens -= w.num_tokens_to_compute - w.handoff
                self._finish_aborted(w)
                return True
        return False

    def take_aborted(self) -> list[Request]:
        """Requests aborted (and gone from here) since the last call: the backend forgets
        them."""
        out, self._aborted = self._aborted, []
        return out

    def _abort_running(self, r: Request) -> None:
        rid = r.request_id
        if self._drawn is not None:
            self._drawn.forget(r, told=True)
        if self._event and rid in self._decoding:
            self.recorder.close_run(r, self.clock.step - 1)
        if rid in self._prefilling:
            self.queued_prefill_tokens -= r.num_tokens_to_compute - r.handoff
        self._remove_running(r)
        self._finish_aborted(r)

    def _finish_aborted(self, r: Request) -> None:
        self.kv.free(r)  # holds no blocks by now: drops its prompt hashes
        r.status = RequestStatus.FINISHED
        self._aborted.append(r)
        self.num_aborted += 1

    # -- disaggregation -------------------------------------------------------------------------
    # A request routed to a prefill replica (``handoff`` set) computes all but its prompt's last
    # token there and is handed off: it leaves the running set, keeps its blocks, and waits in
    # ``take_handoffs`` for the cluster. A decode replica reserves its blocks before the
    # transfer (``reserve_import``), is told when the KV has arrived (``finish_import``) and
    # then admits it ahead of waiting requests: its one remaining prompt token emits the first
    # output token. Once the transfer is done the prefill replica frees the blocks
    # (``release_handoff``; prompt blocks stay in its prefix cache).

    def _hand_off(self, r: Request, now: float) -> None:
        rid = r.request_id
        del self.running[rid]
        self._prefilling.pop(rid, None)
        self.ledger.drop(rid)
        r.status = RequestStatus.TRANSFERRING
        r.handoff = False  # from here on it is to be decoded
        self._handed[rid] = r
        self._new_handoffs.append((r, now))
        self.recorder.hand_off(r)

    def take_handoffs(self) -> list[tuple[Request, float]]:
        """Requests handed off since the last call (their blocks still held here), each with
        the time its step's update was given (in the simulator, the step's end: KV ready)."""
        out, self._new_handoffs = self._new_handoffs, []
        return out

    def release_handoff(self, r: Request) -> int:
        """``r``'s KV has been transferred: free its blocks here; returns how many it held."""
        del self._handed[r.request_id]
        return self.kv.free(r)

    def import_blocks(self, r: Request) -> int:
        """Blocks ``r`` needs here: its transferred KV and its remaining prompt token."""
        return -(-(r.num_computed_tokens + 1) // self._bs)

    def can_import(self, r: Request) -> bool:
        """Whether ``r``'s blocks can be reserved now (free blocks, never preempting)."""
        return not self._never_fits(r) and self.import_blocks(r) <= self.pool.num_free

    def reserve_import(self, r: Request) -> None:
        """Reserve ``r``'s blocks before its KV is transferred here (``can_import`` held)."""
        assert r.status is RequestStatus.TRANSFERRING and r.request_id not in self._importing
        if not self.kv.allocate(r, self.import_blocks(r)):
            raise RuntimeError(f"request {r.request_id}: reserve_import without can_import")
        self._importing[r.request_id] = r
        self.recorder.arrive(r)

    def finish_import(self, r: Request) -> None:
        """``r``'s KV has arrived: it is admitted ahead of waiting requests."""
        del self._importing[r.request_id]
        r.status = RequestStatus.WAITING
        self._ready.append(r)
        self.queued_prefill_tokens += 1

    def _admit_imports(self, now: float, budget: int, prefills: list[tuple[Request, int]]) -> int:
        """Start arrived imports, oldest first, while budget and seats allow."""
        ready, max_seqs = self._ready, self.config.max_num_seqs
        while ready and budget > 0 and len(self.running) < max_seqs:
            r = ready.popleft()
            self._start(r)
            self.recorder.admit_import(r, now)
            prefills.append((r, 1))
            budget -= 1
        return budget

    @property
    def num_handed_off(self) -> int:
        """Prefilled requests whose KV is still held here for a transfer."""
        return len(self._handed)

    @property
    def num_importing(self) -> int:
        """Requests with blocks reserved here for a transfer (in flight or arrived)."""
        return len(self._importing) + len(self._ready)

    def _check_transfers(self) -> None:
        bs, kv = self._bs, self.kv
        for rid, r in self._handed.items():
            assert r.status is RequestStatus.TRANSFERRING and rid not in self.running
            assert len(kv.blocks_of(r)) == -(-r.num_computed_tokens // bs), f"handed {rid}"
            assert r.num_tokens_to_compute == 1, f"handed-off request {rid} is not prefilled"
        for rid, r in self._importing.items():
            assert r.status is RequestStatus.TRANSFERRING and rid not in self.running
            assert len(kv.blocks_of(r)) == self.import_blocks(r), f"importing {rid}"
        for r in self._ready:
            assert r.status is RequestStatus.WAITING and r.num_tokens_to_compute == 1
            assert len(kv.blocks_of(r)) == self.import_blocks(r), f"ready {r.request_id}"
        assert not set(self._handed) & set(self._importing)

    # -- end of run ------------------------------------------------------------------------------
    def finish_run(self) -> None:
        """Close open token runs of requests still running when the run is cut off."""
        if self._event:
            for r in self._decoding.values():
                self.recorder.close_run(r, self.clock.step - 1)
        if self._drawn is not None:
            self._drawn.finish_run()

    def check_integrity(self) -> None:
        """Queues, block tables, reservations and counters agree (and the policy's own state)."""
        self.kv.check_integrity()
        self.ledger.check(self.kv, self.running)
        bs = self._bs
        for rid, r in self.running.items():
            assert r.status is RequestStatus.RUNNING
            held = len(self.kv.blocks_of(r))
            assert held == -(-r.num_computed_tokens // bs), (
                f"request {rid}: {held} blocks for {r.num_computed_tokens} tokens"
            )
            assert (rid in self._prefilling) == r.is_prefill
            if self._event:
                assert (rid in self._decoding or rid in self._speculating) == r.is_decode
        assert set(self._prefilling) <= set(self.running)
        assert set(self._decoding) <= set(self.running)
        assert set(self._speculating) <= set(self.running)
        assert not set(self._speculating) & set(self._decoding), "speculating and anchored"
        if self._last_plan_step < self.clock.step:  # no plan pending: every draft trimmed
            assert not self.kv.num_draft_tails, "draft blocks left after an update"
        assert self._aborting <= set(self.running), "an abort pending for a request not running"
        for _, _, r in self._waiting:
            assert r.status is RequestStatus.WAITING and not self.kv.blocks_of(r)
        self._check_transfers()
        queued = (
            sum(r.num_tokens_to_compute - r.handoff for _, _, r in self._waiting)
            + sum(r.num_tokens_to_compute - r.handoff for r in self._prefilling.values())
            + len(self._ready)
        )
        assert queued == self.queued_prefill_tokens, (
            f"queued prefill tokens {self.queued_prefill_tokens} != {queued}"
        )
        if self._event:
            assert self._ctx_base + len(self._decoding) * self.clock.step == sum(
                r.num_computed_tokens for r in self._decoding.values()
            )
            step = self.clock.step
            longest = max(
                (r.num_computed_tokens - step for r in self._decoding.values()), default=0
            )
            assert self._longest_drift in (None, longest), (self._longest_drift, longest)
        self.policy.check_integrity()
        if self.speculation is not None:
            self.speculation.check_integrity()
        if self._drawn is not None:
            self._drawn.check_integrity()


def _chunk_shape(prefills: list[tuple[Request, int]]) -> tuple[int, int, int]:
    """The chunks' tokens, attention pairs (causal, over each chunk's context) and context
    tokens at their ends."""
    chunk_tokens = pairs = context = 0
    for r, n in prefills:
        c = r.num_computed_tokens
        chunk_tokens += n
        pairs += n * c + n * (n + 1) // 2
        context += c + n
    return chunk_tokens, pairs, context
