"""``prefix_aware``: the replica that holds the longest cached prefix of the prompt, unless it
is too busy (the seed's hybrid cache-aware routing, SGLang's cache-aware router)."""

from __future__ import annotations

from horizon.cluster.router import Router, least_loaded_index


class PrefixAware(Router):
    """Longest prefix-cache hit; among equal hits the least loaded.

    Args:
        threshold: queue depth (waiting requests) of the best-hit replica above which the
            request goes to the least-loaded replica instead (None: never, pure cache affinity).
        min_hit_tokens: a best hit shorter than this routes least-loaded (0: any hit counts).
    """

    name = "prefix_aware"

    def __init__(self, threshold: int | None = 8, min_hit_tokens: int = 0) -> None:
        if threshold is not None and (not isinstance(threshold, int) or threshold < 0):
            raise ValueError(
                f"prefix_aware.threshold must be None or an int >= 0, got {threshold!r}"
            )
        if not isinstance(min_hit_tokens, int) or min_hit_tokens < 0:
            raise ValueError(
                f"prefix_aware.min_hit_tokens must be an int >= 0, got {min_hit_tokens!r}"
            )
        self.threshold = threshold
        self.min_hit_tokens = min_hit_tokens

    def route(self, request, replicas, now):  # noqa: ANN001, ANN201 - Router.route
        hits = [v.prefix_hit_tokens(request) for v in replicas]
        top = max(hits)
        if top < max(1, self.min_hit_tokens):
            return least_loaded_index(replicas)
        # the least loaded of the best hits (load and routed are read only for those)
        tied = [i for i, h in enumerate(hits) if h == top]
        at = tied[0] if len(tied) == 1 else tied[least_loaded_index([replicas[i] for i in tied])]
        if self.threshold is not None and replicas[at].num_waiting > self.threshold:
            return least_loaded_index(replicas)
        return at
