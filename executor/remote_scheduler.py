"""What the engine cluster's driver knows of a worker's scheduler in a disaggregated run.

``horizon.cluster.handoffs.Handoffs`` places handoffs by calling the prefill and decode
replicas' schedulers (``take_handoffs``, ``never_fits``, ``can_import``, ``reserve_import``,
``release_handoff``, ``kv.blocks_of``). On the engine those schedulers live in worker
processes (``executor.cluster_worker``, ``executor.kv_agent``), so the driver gives each
``RemoteReplica`` a ``RemoteScheduler`` with those methods, so that the same placement code
runs on both backends:

* ``take_handoffs`` returns what the prefill worker reported (``handoffs`` messages);
* ``can_import`` is an estimate: the decode worker's free blocks at its latest report, less
  the blocks of imports sent since and not yet answered. The worker decides: it reserves the
  blocks only if they fit when the import reaches it, and refuses otherwise (the driver then
  places the request again), so a request never lands where it cannot fit
  (``horizon.cluster.reported_imports``, which the simulator's reported placement shares);
* ``reserve_import`` counts the blocks (the driver sends the import); ``release_handoff``
  sends the release to the prefill worker; ``kv.blocks_of`` tells where the driver believes a
  request's blocks are.
"""

from __future__ import annotations

from collections.abc import Callable

from horizon.cluster.reported_imports import ReportedImports
from horizon.request import Request

Send = Callable[[tuple], None]


class RemoteScheduler(ReportedImports):
    """The driver's proxy of one worker's scheduler (see the module docstring): a decode
    replica's side is ``ReportedImports``; a prefill replica's is below.

    Args:
        index: the replica's index; num_blocks, block_size, max_model_len: its pool and limit.
        send: puts a message in the worker's inbox.
        free_blocks: the worker's free blocks at its latest report.
    """

    def __init__(
        self,
        index: int,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        send: Send,
        free_blocks: Callable[[], int],
    ) -> None:
        super().__init__(num_blocks, block_size, max_model_len, free_blocks)
        self.index = index
        self.send = send
        self.reported_handoffs: list[tuple[Request, float]] = []  # handed off, not yet taken

    # -- prefill replica -------------------------------------------------------------------------
    def handed_off(self, r: Request, n: int, blocks: tuple[int, ...], ready: float) -> None:
        """The worker handed ``r`` off with ``n`` tokens computed in ``blocks``."""
        r.set_computed(n)
        self.kv.held[r.request_id] = tuple(blocks)
        self.reported_handoffs.append((r, ready))

    def take_handoffs(self) -> list[tuple[Request, float]]:
        out, self.reported_handoffs = self.reported_handoffs, []
        return out

    def release_handoff(self, r: Request) -> int:
        n = len(self.kv.held.pop(r.request_id))
        self.send(("release", r.request_id))
        return n
