"""``least_kv``: the replica whose KV pool is least committed (BLIS's kv-utilisation scorer)."""

from __future__ import annotations

from horizon.cluster.router import Router, argmin


class LeastKV(Router):
    """Smallest KV demand share: ``(used + reserved [+ queued prefill blocks]) / blocks``.

    Args:
        count_queued: also count the blocks the replica's queued prefill tokens will take
            (False: held and reserved blocks only, vLLM's ``kv_cache_usage``).
    """

    name = "least_kv"

    def __init__(self, count_queued: bool = True) -> None:
        self.count_queued = count_queued

    def route(self, request, replicas, now):  # noqa: ANN001, ANN201 - Router.route
        if self.count_queued:
            return argmin(replicas, _demand)
        return argmin(replicas, lambda v: v.kv_utilization)


def _demand(v) -> float:  # noqa: ANN001 - a ReplicaView
    queued = v.queued_prefill_tokens / v.block_size
    return (v.kv_used_blocks + v.kv_reserved_blocks + queued) / v.num_blocks
