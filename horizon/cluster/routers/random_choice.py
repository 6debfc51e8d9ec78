"""``random``: a replica drawn uniformly at random (Vidur's baseline)."""

from __future__ import annotations

import random

from horizon.cluster.router import Router


class RandomRouter(Router):
    """Uniform choice.

    Args:
        seed: the router's own random stream (the same seed gives the same choices).
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def route(self, request, replicas, now):  # noqa: ANN001, ANN201 - Router.route
        return self._rng.randrange(len(replicas))
