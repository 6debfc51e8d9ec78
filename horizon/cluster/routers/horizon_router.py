"""``horizon``: Horizon's idea across a fleet. Route to a replica where the request's first
token can meet its TTFT deadline and whose predicted KV demand leaves the most room.

For each replica, from its view:

* estimated TTFT: the prefill tokens ahead of the request (the replica's queued prefill plus the
  request's own after its prefix-cache hit) over the prefill tokens a step can take (the token
  budget less one per running request), times the replica's recent step time;
* predicted KV share: tokens its unfinished requests are predicted to hold at their end (the
  replica's predictor), plus this request's prompt and predicted output, over the pool; with no
  predictor on the replica, held plus reserved blocks plus queued prefill instead.

Among replicas whose estimated TTFT is within ``slack`` times the deadline and whose share stays
below ``1 - headroom``, the smallest share wins; if none qualifies, the earliest estimated TTFT.
"""

from __future__ import annotations

import math

from horizon.cluster.router import Router


class HorizonRouter(Router):
    """Args:
    ttft_slo: the TTFT deadline (s) for requests without an SLO of their own (a run fills it
        from its SLO preset).
    predictor: predicts the routed request's output length (``predict(r).mean``); None: the
        replica views' figures only, the request's output counted as ``default_output``.
    headroom: share of each pool kept free of predicted demand.
    slack: multiple of the deadline an estimate may reach and still count as feasible.
    default_output: output tokens assumed without a predictor.
    """

    name = "horizon"

    def __init__(
        self,
        ttft_slo: float = 1.0,
        predictor: object = None,
        headroom: float = 0.1,
        slack: float = 1.0,
        default_output: int = 256,
    ) -> None:
        if not (isinstance(ttft_slo, (int, float)) and ttft_slo > 0):
            raise ValueError(f"horizon router.ttft_slo must be > 0, got {ttft_slo!r}")
        if not 0 <= headroom < 1:
            raise ValueError(f"horizon router.headroom must be in [0, 1), got {headroom!r}")
        if not slack > 0:
            raise ValueError(f"horizon router.slack must be > 0, got {slack!r}")
        self.ttft_slo, self.predictor = ttft_slo, predictor
        self.headroom, self.slack, self.default_output = headroom, slack, default_output

    def _output(self, request) -> float:  # noqa: ANN001
        if self.predictor is None:
            return float(min(self.default_output, request.max_output_tokens))
        return float(self.predictor.predict(request).mean)

    def estimates(self, request, replicas) -> list[tuple[float, float]]:  # noqa: ANN001
        """(estimated TTFT s, predicted KV share) per replica."""
        out = []
        output = self._output(request)
        for v in replicas:
            own = request.num_prompt_tokens - v.prefix_hit_tokens(request)
            per_step = max(1, v.token_budget - v.num_running)
            steps = math.ceil((v.queued_prefill_tokens + own) / per_step)
            ttft = steps * v.step_time
            pool = v.num_blocks * v.block_size
            demand = v.predicted_kv_tokens
            if math.isnan(demand):
                demand = (v.kv_used_blocks + v.kv_reserved_blocks) * v.block_size
                demand += v.queued_prefill_tokens
            out.append((ttft, (demand + own + output) / pool))
        return out

    def route(self, request, replicas, now):  # noqa: ANN001, ANN201 - Router.route
        deadline = request.slo.ttft if request.slo is not None else self.ttft_slo
        est = self.estimates(request, replicas)
        ok = [
            (share, ttft, replicas[i].routed, i)
            for i, (ttft, share) in enumerate(est)
            if ttft <= self.slack * deadline and share <= 1 - self.headroom
        ]
        if ok:
            return min(ok)[3]
        return min(range(len(est)), key=lambda i: (est[i][0], est[i][1], i))
