"""``cost_aware``: the cheapest replica by blocks to prefill after the cache overlap plus its
decode load (Dynamo's KV router).

For replica r: ``cost = overlap_weight * prefill_blocks + decode_blocks``, where
``prefill_blocks`` are the request's prompt blocks r's cache does not hold plus r's queued
prefill, and ``decode_blocks`` the blocks r's running requests hold. With ``temperature`` 0 the
cheapest wins; above 0 a replica is drawn with probability ``softmax(-cost / (temperature *
mean cost))`` (Dynamo's sampling, costs normalised so that the temperature is unitless).
"""

from __future__ import annotations

import math
import random

from horizon.cluster.router import Router


class CostAware(Router):
    """Args:
    overlap_weight: weight of prefill blocks against decode blocks (1: Dynamo's default).
    temperature: 0 picks the cheapest; > 0 samples (see the module docstring).
    seed: the sampling's random stream.
    """

    name = "cost_aware"

    def __init__(
        self, overlap_weight: float = 1.0, temperature: float = 0.0, seed: int = 0
    ) -> None:
        if not isinstance(overlap_weight, (int, float)) or overlap_weight < 0:
            raise ValueError(f"cost_aware.overlap_weight must be >= 0, got {overlap_weight!r}")
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"cost_aware.temperature must be >= 0, got {temperature!r}")
        self.overlap_weight = overlap_weight
        self.temperature = temperature
        self._rng = random.Random(seed)

    def costs(self, request, replicas) -> list[float]:  # noqa: ANN001
        out = []
        for v in replicas:
            bs = v.block_size
            new = -(-(request.num_prompt_tokens - v.prefix_hit_tokens(request)) // bs)
            prefill = new + v.queued_prefill_tokens / bs
            out.append(self.overlap_weight * prefill + v.kv_used_blocks)
        return out

    def route(self, request, replicas, now):  # noqa: ANN001, ANN201 - Router.route
        costs = self.costs(request, replicas)
        if self.temperature == 0:
            return min(range(len(costs)), key=lambda i: (costs[i], replicas[i].routed, i))
        scale = self.temperature * max(1e-9, sum(costs) / len(costs))
        lo = min(costs)
        weights = [math.exp(-(c - lo) / scale) for c in costs]
        return self._rng.choices(range(len(costs)), weights)[0]
