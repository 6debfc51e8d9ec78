"""The simulator's side of prefill/decode disaggregation: when handoffs are placed, and how long
their KV takes to move (``simulator.kv_link``).

The protocol is the cluster's (``horizon.cluster.handoffs``). Here: after every step's update of
a prefill replica, its handed-off requests are collected and placed at the step's end (when
their KV is ready); after every step of a decode replica (which may have freed blocks), pending
requests are placed again. A placed transfer sends its bytes over the fabric from its start;
when they are in, the source frees the blocks and the target's inbox admits the request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import simpy

from horizon.cluster import Cluster
from horizon.cluster.handoffs import Handoffs, Transfer
from horizon.model_shape import ModelShape
from simulator.kv_link import Fabric, LinkSpec


class TransferDriver:
    """Places handoffs and moves their KV on the simulated clock.

    Args:
        env: the run's SimPy environment.
        cluster: a disaggregated cluster (its ``handoffs`` set).
        shapes: each replica's model shape (a prefill replica's prices its KV bytes).
        link: the KV link between replicas.
        arrived: ``arrived(transfer)`` once a transfer's KV is in (the driver admits it).
    """

    def __init__(
        self,
        env: simpy.Environment,
        cluster: Cluster,
        shapes: Sequence[ModelShape | None],
        link: LinkSpec,
        arrived: Callable[[Transfer], None],
    ) -> None:
        assert cluster.handoffs is not None
        for r, shape in zip(cluster.replicas, shapes):
            if r.role == "prefill" and shape is None:
                raise ValueError(f"ReplicaSetup.shape is needed on prefill replica {r.index}")
        self.env = env
        self.handoffs: Handoffs = cluster.handoffs
        self.replicas = cluster.replicas
        self.shapes = tuple(shapes)
        self.fabric = Fabric(env, link)
        self.arrived = arrived

    def after_update(self, index: int) -> Callable[[], None] | None:
        """The serving loop's hook for replica ``index`` (None for a mixed replica)."""
        role, handoffs = self.replicas[index].role, self.handoffs
        if role == "prefill":

            def collected() -> None:
                ready = handoffs.collect(index)
                if ready is not None:
                    self.env.process(self._place_at(ready))

            return collected
        if role == "decode":

            def freed() -> None:
                if handoffs.pending:
                    self._place(self.env.now)

            return freed
        return None

    def _place_at(self, ready: float):  # noqa: ANN202 - a SimPy process
        if ready > self.env.now:
            yield self.env.timeout(ready - self.env.now)
        self._place(self.env.now)

    def _place(self, now: float) -> None:
        for t in self.handoffs.place(now):
            self.env.process(self._move(t))

    def kv_bytes(self, t: Transfer) -> int:
        """Bytes of ``t``'s blocks (whole blocks move, as in a paged engine)."""
        shape = self.shapes[t.src]
        assert shape is not None
        bs = self.replicas[t.src].block_size
        return t.num_blocks * bs * shape.kv_bytes_per_token()

    def _move(self, t: Transfer):  # noqa: ANN202 - a SimPy process
        env = self.env
        if t.start > env.now:
            yield env.timeout(t.start - env.now)
        yield env.process(self.fabric.send(t.src, t.dst, self.kv_bytes(t)))
        self.handoffs.complete(t, env.now)
        self.arrived(t)

    def check_integrity(self) -> None:
        self.fabric.check_integrity()
