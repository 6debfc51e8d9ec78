"""SGLang's admission control as its scheduler does it: a baseline production engines ship.

Followed: SGLang's main branch of the v0.5 era, in ``python/sglang/``:
``srt/managers/schedule_policy.py`` (``PrefillAdder``, ``SchedulePolicy``; commit ad0119f),
``srt/managers/schedule_batch.py`` (``retract_decode``, ``check_decode_mem``; 000eaff),
``global_config.py`` (the ratio's constants; 025ea29) and ``srt/server_args.py``
(``--schedule-policy``, ``--schedule-conservativeness``), checked against the later main branch
(schedule_policy.py 00550cd, ``srt/managers/scheduler_components/new_token_ratio_tracker.py``
1a882c5, ``srt/environ.py``), where the same rules and defaults live in ``NewTokenRatioTracker``
and ``SGLANG_*`` environment variables.

SGLang's mechanisms, mapped onto the scheduler's questions:

* **Reserve** (``reserve_tokens``): a running request keeps promised the tokens it holds plus
  ``ratio * min(max_output_tokens - output_tokens, clip)`` (``PrefillAdder`` subtracts that
  offset for every running request from the free and evictable tokens). In the step a request
  is admitted, its own share is whole: ``min(remaining, clip)``, as ``PrefillAdder`` charges the
  requests it adds to the batch being built; from the next step on it is a running request.
* **Admission** (``admit``): a waiting request starts only if its uncached prompt plus
  ``min(remaining, clip)`` fits in the free blocks left after every reservation; the first that
  does not fit stops admission for the step (``add_one_req``'s ``NO_TOKEN``).
* **Ratio**: starts at ``init = min(init_ratio * conservativeness, 1)``, falls by
  ``(init - floor) / decay_steps`` at every step that decodes, down to
  ``floor = min(init * min_ratio_factor, 1)``. A retraction sets it to the survivors' estimate
  ``min(1, (tokens decoded + retract_decode_steps * n) / (sum of max_output_tokens + 1))``
  (up or down: with 2,048-token caps and a few hundred tokens decoded it lands near or below
  the floor, where the next decode step puts it). When the pool is idle (an admission finds
  nothing running) it returns to ``init``.
* **Retraction** (``choose_victim``, a preemption by recompute for lack of a block): the
  running request with the fewest output tokens, then the longest prompt, then the latest
  admitted (``retract_decode`` sorts by ``(outputs, -prompt)`` descending and pops the last).
  The step that retracts admits nothing (SGLang's retracting iteration is a decode batch).
* **Order**: FCFS by entry into the queue (a retracted request goes to the back, as SGLang
  appends it to its waiting queue). With ``lpm`` and prefix caching on, at every step: longest
  cached prefix first, except that a request with at most 32 cached tokens whose first 32 prompt
  tokens repeat an earlier such waiting request's goes last (SGLang's in-batch prefix caching:
  one of them warms the cache for the others); more than 128 waiting: FCFS, as SGLang does.
  ``lpm`` is off by default: SGLang's ``--schedule-policy`` defaults to ``fcfs`` (it was
  ``lpm`` in early versions), even with the radix cache on.

Deliberate differences:

* Blocks, not tokens: SGLang's radix cache matches and its pool counts single tokens (page size
  1 by default); here a cached prefix is whole blocks of prompt (generated tokens are not
  hashed) and each reservation rounds up to whole blocks. A request fits when the blocks come
  out exactly (SGLang asks for one token to spare).
* Mixed steps: the ratio decays at every step with a decode; SGLang runs prefill batches and
  decode batches apart (mixed chunks are off by default) and decays on decode batches only.
* Chunked prefill: every running request, several of them possibly mid-prefill, is reserved its
  whole prompt and its ratio share; SGLang has one chunked request at a time, reserves none of
  its output until its last chunk, and shortens a chunk that does not fit instead of
  retracting. Here a prefill chunk that finds no block preempts, like a decode.
* Victims come from every running request (one still in prefill has no output token, so it
  goes first); SGLang retracts from its decode batch only, never its last request (it aborts
  that one if memory still lacks), and evicts radix-cache nodes as it goes.
* Not modelled: priority scheduling and its preemption, ``ignore_eos`` requests' separate
  admission check, the prefill token cap (the scheduler's step budget plays it), LPM ties kept
  in the queue's previous order (here: entry order), other policies (``lof``, ``dfs-weight``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from horizon.kv_cache import KVView
from horizon.policies.base import Policy
from horizon.request import Request

LPM_MAX_WAITING = 128  # SGLang orders a longer queue FCFS: prefix matching costs too much
IN_BATCH_PREFIX_TOKENS = 32  # SGLang's IN_BATCH_PREFIX_CACHING_{CHECK,DEPRIORITIZE}_THRESHOLD


class SGLangPolicy(Policy):
    name = "sglang"
    refresh_every = 1  # the ratio moves every step, and every reservation with it

    def __init__(
        self,
        conservativeness: float = 1.0,
        init_ratio: float = 0.7,
        min_ratio_factor: float = 0.14,
        decay_steps: int = 600,
        clip_max_new_tokens: int = 4096,
        retract_decode_steps: int = 20,
        lpm: bool = False,
    ) -> None:
        _check_knobs(
            conservativeness,
            init_ratio,
            min_ratio_factor,
            decay_steps,
            clip_max_new_tokens,
            retract_decode_steps,
            lpm,
        )
        self.init_ratio = min(init_ratio * conservativeness, 1.0)
        self.min_ratio = min(self.init_ratio * min_ratio_factor, 1.0)
        self.decay = (self.init_ratio - self.min_ratio) / decay_steps
        self.clip = clip_max_new_tokens
        self.retract_decode_steps = retract_decode_steps
        self.lpm = lpm
        self.dynamic_order = lpm
        self.ratio = self.init_ratio
        self.num_retractions = 0
        self._step = -1  # the step being planned (from refresh)
        self._retract_step = -2  # the latest step that retracted
        self._admitting = -1  # the request admit() just let through: whole share once
        self._entered: dict[int, float] = {}  # waiting id -> time it entered the queue

    # -- the reserve -----------------------------------------------------------------------------
    def clipped_remaining(self, req: Request) -> int:
        """SGLang's estimate of the tokens ``req`` may still generate: its cap, clipped."""
        return min(max(req.max_output_tokens - req.num_output_tokens, 0), self.clip)

    def reserve_tokens(self, req: Request) -> int:
        rest = self.clipped_remaining(req)
        if req.request_id == self._admitting:  # asked right after admission
            self._admitting = -1
            self._entered.pop(req.request_id, None)
            return req.num_tokens + rest
        return req.num_tokens + math.ceil(self.ratio * rest)

    def admit(self, req: Request, view: KVView) -> bool:
        if view.num_running == 0:
            self.ratio = self.init_ratio  # idle: SGLang resets the ratio
        elif view.step == self._retract_step:
            return False
        need = view.blocks_to_admit(req, req.num_tokens + self.clipped_remaining(req))
        if need > view.num_free_blocks - view.num_reserved_blocks:
            return False
        self._admitting = req.request_id
        return True

    # -- the ratio -------------------------------------------------------------------------------
    def refresh(self, view: KVView, now: float) -> None:
        """One step: the ratio decays toward its floor if the step decodes."""
        self._step = view.step
        if any(r.is_decode for r in view.running):
            self.ratio = max(self.ratio - self.decay, self.min_ratio)

    def choose_victim(self, running: Sequence[Request], needing: Request, now: float) -> Request:
        """Fewest output tokens, then longest prompt, then latest admitted; the ratio becomes
        the decoding survivors' estimate."""
        victim = min(running, key=_retract_order)
        survivors = [r for r in running if r is not victim and r.is_decode]
        decoded = sum(r.num_output_tokens for r in survivors)
        caps = sum(r.max_output_tokens for r in survivors)
        self.ratio = min(1.0, (decoded + self.retract_decode_steps * len(survivors)) / (caps + 1))
        self._retract_step = self._step
        self.num_retractions += 1
        return victim

    # -- the order -------------------------------------------------------------------------------
    def waiting_key(self, req: Request, now: float) -> Any:
        """Queue-entry order (``now``: the arrival, or the retraction); records it for LPM."""
        self._entered[req.request_id] = now
        return (0, 0, now)

    def rank_waiting(self, waiting: Sequence[Request], view: KVView, now: float) -> list[Any]:
        """Longest cached prefix first, a request repeating a waiting one's head last (LPM);
        FCFS without prefix caching or past 128 waiting requests."""
        entered = [self._entered[r.request_id] for r in waiting]
        if not view.prefix_caching or len(waiting) > LPM_MAX_WAITING:
            return [(0, 0, t) for t in entered]
        keys: list[Any] = [None] * len(waiting)
        heads: set[tuple[int, ...]] = set()
        for i in sorted(range(len(waiting)), key=entered.__getitem__):
            r = waiting[i]
            cached = view.cached_prefix_tokens(r)
            ids = r.prompt_token_ids
            if cached <= IN_BATCH_PREFIX_TOKENS and ids and len(ids) >= IN_BATCH_PREFIX_TOKENS:
                head = tuple(ids[:IN_BATCH_PREFIX_TOKENS])
                if head in heads:
                    keys[i] = (1, 0, entered[i])
                    continue
                heads.add(head)
            keys[i] = (0, -cached, entered[i])
        return keys

    def check_integrity(self) -> None:
        """The ratio is a share in [0, 1] and its schedule is ordered: floor <= init."""
        assert 0.0 <= self.ratio <= 1.0, f"new-token ratio {self.ratio} outside [0, 1]"
        assert 0.0 <= self.min_ratio <= self.init_ratio <= 1.0 and self.decay >= 0.0


def _retract_order(r: Request) -> tuple[int, int, int]:
    return (r.num_output_tokens, -r.num_prompt_tokens, -r.admit_seq)


def _check_knobs(
    conservativeness: float,
    init_ratio: float,
    min_ratio_factor: float,
    decay_steps: int,
    clip: int,
    retract_decode_steps: int,
    lpm: bool,
) -> None:
    for field, v in (("conservativeness", conservativeness), ("init_ratio", init_ratio)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"sglang.{field} must be a finite number > 0, got {v!r}")
    if not (isinstance(min_ratio_factor, (int, float)) and 0 <= min_ratio_factor <= 1):
        raise ValueError(f"sglang.min_ratio_factor must be in [0, 1], got {min_ratio_factor!r}")
    for field, n, low in (
        ("decay_steps", decay_steps, 1),
        ("clip_max_new_tokens", clip, 1),
        ("retract_decode_steps", retract_decode_steps, 0),
    ):
        if not (isinstance(n, int) and not isinstance(n, bool) and n >= low):
            raise ValueError(f"sglang.{field} must be an int >= {low}, got {n!r}")
    if not isinstance(lpm, bool):
        raise ValueError(f"sglang.lpm must be true or false, got {lpm!r}")
