"""Work the engine did for nothing, or could have done and did not: preemptions and waste.

- **Recompute waste** = recomputed tokens / all computed tokens, over the run: the share of the
  engine's token work spent rebuilding KV that a preemption threw away.
- **Prefill-chunk waste** = the share of the step token budget left unused in steps where
  requests were waiting:

      sum over steps with num_waiting > 0 of (token_budget - prefill_tokens - decode_tokens)
      ----------------------------------------------------------------------------------
      sum over the same steps of token_budget

  A step with an empty queue cannot use its spare budget, so it is not counted; a step with
  requests waiting could have spent it on a prefill chunk but did not (the KV cache was full, or
  the policy held them back). 0 means every such step was full; 1 means they ran empty.
"""

from __future__ import annotations

import numpy as np

from horizon.metrics.records import RunRecords


def preemptions(rec: RunRecords) -> int:
    """Preemptions (by recompute) over the run, all requests together."""
    return int(rec.num_preemptions.sum())


def preempted_requests(rec: RunRecords) -> int:
    """Requests preempted at least once."""
    return int(np.count_nonzero(rec.num_preemptions > 0))


def prefix_hit_rate(rec: RunRecords) -> float:
    """Prefill tokens served by the prefix cache / all prefill tokens needed (cached plus those
    computed by prefill chunks, recompute included); NaN when no prefill happened."""
    cached = int(rec.cached_tokens.sum())
    total = cached + int(rec.prefill_tokens.sum())
    return float(cached / total) if total > 0 else np.nan


def recompute_waste(rec: RunRecords) -> float:
    """Recomputed tokens / computed tokens (NaN when nothing was computed)."""
    computed = int(rec.computed_tokens.sum())
    return float(rec.recomputed_tokens.sum() / computed) if computed else np.nan


def prefill_chunk_waste(rec: RunRecords) -> float:
    """Unused share of the token budget in steps where requests were waiting (module docstring).

    NaN when no step had requests waiting (or their budgets sum to 0).
    """
    busy = rec.num_waiting > 0
    budget = int(rec.token_budget[busy].sum())
    if budget == 0:
        return np.nan
    used = int(rec.prefill_tokens[busy].sum()) + int(rec.decode_tokens[busy].sum())
    return float((budget - used) / budget)
