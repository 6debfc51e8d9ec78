"""``least_loaded``: the replica with the fewest waiting plus running requests (Vidur's
least-outstanding, BLIS's least-loaded)."""

from __future__ import annotations

from horizon.cluster.router import Router, least_loaded_index


class LeastLoaded(Router):
    """Fewest ``waiting + running``; ties to the replica sent the fewest requests. No knobs."""

    name = "least_loaded"

    def route(self, request, replicas, now):  # noqa: ANN001, ANN201 - Router.route
        return least_loaded_index(replicas)
