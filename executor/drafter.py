"""Drafters: who proposes the draft tokens of a speculating request at execute time.

The scheduler decides how many drafts ``k`` a request may verify in a step (``StepPlan.verifies``,
``horizon.speculation``); the runner asks its drafter for them when it stages the step, from the
request's token history (prompt + generated, its last token included). A drafter may propose
fewer than ``k`` (none found): the request then verifies what was proposed (``m <= k`` drafts,
``m + 1`` query tokens, at most ``m`` accepted), which the scheduler's contract allows
(``StepResult.accepted`` is ``0..k``; the blocks for the unused drafts are trimmed by its update).

A drafter is a registered name (``ngram``, ``draft_model``, ``paged_draft_model``,
``eagle3_head``) or ``package.module:Class`` (``make_drafter``). A draft model plugs in
through ``propose_batch``, which sees every verifying request of the step at once with its id
(batched forwards of a smaller decoder, whose per-request state ``forget`` drops:
``executor.draft_model``'s dense reference, ``executor.paged_draft``'s paged decode steps, a
draft head on them, ``executor.draft_head``); the built-in n-gram drafter is model-free,
stateless, and loops over the requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from horizon.registry import Registry


class Drafter:
    """Proposes draft tokens for verifying requests.

    Contracts:
        * ``propose(tokens, k)``: ``tokens`` is one request's history (int array, prompt +
          generated, its last token last; read-only); returns at most ``k`` int tokens
          (possibly none), the request's next tokens as the drafter guesses them.
        * ``propose_batch`` gets the step's verifying requests' histories, ``k``s and ids in
          plan order and returns one proposal each (default: ``propose`` per request).
        * ``prefetch(histories, ks, request_ids)``: the runner's hint, right after a
          verification, of the requests' next proposals (their histories as committed); a
          drafter may start on them now (``executor.paged_draft``: on the device, while the
          host plans the next step) but ``propose_batch`` must still return its drafts of
          the histories it is given (up to the rounding of another batching). Default:
          ignored.
        * optional ``propose_on_device(histories, ks, request_ids)``: the drafts as an int
          tensor on the runner's device, ``[max k, >= n]``, column ``i`` holding request
          ``i``'s ``ks[i]`` drafts (exactly that many, ids in the target's vocabulary, checked
          once read back), or ``None`` (then ``propose_batch``); the runner stages the
          verification while they are made and reads them back with its result.
        * optional ``check_integrity()``: called by the runner's.
        * ``forget(request_id)``: the runner no longer holds the request (finished, aborted,
          or a new run); a drafter with per-request state drops it.
        * Deterministic drafters only: acceptance treats a draft as drawn from a one-hot
          distribution (``executor.verify``), so a drafter that samples its drafts would need
          its probabilities passed to the verification, which this interface does not carry.
        * The runner rolls nothing back for a drafter: the history passed in is the accepted
          one, and a drafter that keeps state (a draft model's cache) must check it against
          that history (rejected drafts, a preemption's recompute).
        * ``vocab_size``: the most token ids the drafter reads (a draft model's embedding
          rows), or ``None`` (any id: n-gram lookup). The runner refuses a drafter whose
          ``vocab_size`` is below the target's, which can emit every id the drafter is fed.
    """

    name = "base"
    vocab_size: int | None = None

    def propose(self, tokens: np.ndarray, k: int) -> np.ndarray:
        return np.zeros(0, dtype=np.int64)

    def propose_batch(
        self, histories: Sequence[np.ndarray], ks: Sequence[int], request_ids: Sequence[int]
    ) -> list[np.ndarray]:
        return [self.propose(h, k) for h, k in zip(histories, ks)]

    def prefetch(
        self, histories: Sequence[np.ndarray], ks: Sequence[int], request_ids: Sequence[int]
    ) -> None:
        """A hint of the next ``propose_batch`` (see the contracts): ignored here."""

    def forget(self, request_id: int) -> None:
        """Drop ``request_id``'s state (stateless: nothing)."""


class NgramDrafter(Drafter):
    """Prompt lookup (vLLM's ``ngram`` proposer): match the history's last ``n`` tokens against
    an earlier place in it, for ``n`` from ``max_n`` down to ``min_n``; at the first ``n`` that
    matches, propose the up to ``k`` tokens that followed the earliest match.

    Args:
        min_n / max_n: n-gram lengths tried (``1 <= min_n <= max_n``).
        pad: fill a proposal shorter than ``k`` with the history's last token, so every
            verification has ``k + 1`` query tokens (for stated acceptance, where the draft
            tokens mean nothing but their verification's cost does). Off by default.
    """

    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 3, pad: bool = False) -> None:
        for field, v in (("min_n", min_n), ("max_n", max_n)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"NgramDrafter.{field} must be an int >= 1, got {v!r}")
        if min_n > max_n:
            raise ValueError(f"NgramDrafter.min_n ({min_n}) must be <= max_n ({max_n})")
        self.min_n, self.max_n, self.pad = min_n, max_n, pad

    def propose(self, tokens: np.ndarray, k: int) -> np.ndarray:
        found = self._lookup(tokens, k)
        if not self.pad or len(found) >= k or k <= 0 or len(tokens) == 0:
            return found
        fill = np.full(k - len(found), tokens[-1], dtype=tokens.dtype)
        return np.concatenate([found, fill])

    def _lookup(self, tokens: np.ndarray, k: int) -> np.ndarray:
        n_len = len(tokens)
        if k <= 0 or n_len < self.min_n + 1:
            return tokens[:0]
        # ends[e]: the n-gram ending at e (e < n_len - 1, so something follows it) equals the
        # history's last n tokens, built up for n = 1, 2, ... with one comparison each
        body = tokens[:-1]
        ends = body == tokens[-1]
        best = -1
        for n in range(1, min(self.max_n, n_len - 1) + 1):
            if n > 1:
                ends[: n - 1] = False
                ends[n - 1 :] &= body[: n_len - n] == tokens[-n]
            if not ends.any():
                break
            if n >= self.min_n:
                best = int(np.argmax(ends))  # earliest match of the longest n so far
        if best < 0:
            return tokens[:0]
        return tokens[best + 1 : best + 1 + k]


def _draft_model(**options: object) -> Drafter:
    from executor.draft_model import DraftModelDrafter  # loads a model: only when asked for

    return DraftModelDrafter(**options)  # type: ignore[arg-type]


def _paged_draft_model(**options: object) -> Drafter:
    from executor.paged_draft import PagedDraftModelDrafter

    return PagedDraftModelDrafter(**options)  # type: ignore[arg-type]


def _eagle3_head(
    target: object = "qwen2.5-7b",
    draft_vocab: int | None = None,
    dtype: str = "bfloat16",
    device: str = "cuda",
    seed: int = 0,
    **paged: object,
) -> Drafter:
    """A draft head in EAGLE-3's layout on ``target``'s width (a preset name or a
    ``ModelConfig``; seeded random weights, ``executor.draft_head``) on the paged drafter
    (``paged``: its ``max_seqs``, ``max_len`` and other options)."""
    from executor.draft_head import draft_head_of
    from executor.model import ModelConfig
    from executor.paged_draft import PagedDraftModelDrafter

    config = ModelConfig.for_preset(target) if isinstance(target, str) else target
    if not isinstance(config, ModelConfig):
        raise ValueError(
            f"eagle3_head.target must be a preset name or a ModelConfig, got {target!r}"
        )
    head = draft_head_of(config, dtype, device, seed, draft_vocab)
    return PagedDraftModelDrafter(head, device=device, dtype=dtype, **paged)  # type: ignore[arg-type]


DRAFTERS: Registry[Drafter] = Registry("drafter")
DRAFTERS.register("ngram", NgramDrafter)
DRAFTERS.register("draft_model", _draft_model)
DRAFTERS.register("paged_draft_model", _paged_draft_model)
DRAFTERS.register("eagle3_head", _eagle3_head)


def make_drafter(name: str, **options: object) -> Drafter:
    """The drafter ``name`` (registered, or ``package.module:Class``) built with ``options``."""
    return DRAFTERS.make(name, **options)
