"""``weighted``: a weighted sum of scorers, the highest total wins (llm-d's endpoint picker).

Each scorer gives every replica a score in [0, 1], higher is better:

* prefix: the share of the prompt this replica's cache holds (llm-d's prefix-cache scorer);
* queue: ``(max_q - q) / (max_q - min_q)`` over the replicas' waiting counts, 1 when all are
  equal (llm-d's queue scorer);
* kv: ``1 - kv_utilization`` (llm-d's kv-cache-utilization scorer).
"""

from __future__ import annotations

from horizon.cluster.router import Router


class Weighted(Router):
    """``prefix_weight * prefix + queue_weight * queue + kv_weight * kv``; ties to the replica
    sent the fewest requests.

    Args:
        prefix_weight: weight of the prefix-cache score (3: llm-d's default profile).
        queue_weight: weight of the queue-depth score (2: llm-d's default profile).
        kv_weight: weight of the KV-utilisation score (1).
    """

    name = "weighted"

    def __init__(
        self, prefix_weight: float = 3.0, queue_weight: float = 2.0, kv_weight: float = 1.0
    ) -> None:
        for field, w in (("prefix_weight", prefix_weight), ("queue_weight", queue_weight),
                         ("kv_weight", kv_weight)):  # fmt: skip
            if not isinstance(w, (int, float)) or w < 0:
                raise ValueError(f"weighted.{field} must be a number >= 0, got {w!r}")
        self.prefix_weight, self.queue_weight, self.kv_weight = (
            prefix_weight,
            queue_weight,
            kv_weight,
        )

    def route(self, request, replicas, now):  # noqa: ANN001, ANN201 - Router.route
        queues = [v.num_waiting for v in replicas]
        lo, hi = min(queues), max(queues)
        span = hi - lo
        prompt = max(1, request.num_prompt_tokens)
        best, at = None, 0
        for i, v in enumerate(replicas):
            score = self.queue_weight * ((hi - queues[i]) / span if span else 1.0)
            score += self.kv_weight * (1.0 - v.kv_utilization)
            if self.prefix_weight:
                score += self.prefix_weight * v.prefix_hit_tokens(request) / prompt
            k = (-score, v.routed, i)
            if best is None or k < best:
                best, at = k, i
        return at
