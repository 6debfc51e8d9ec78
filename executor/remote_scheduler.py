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
  places the request again), so a request never lands where it cannot fit;
* ``reserve_import`` counts the blocks (the driver sends the import); ``release_handoff``
  sends the release to the prefill worker; ``kv.blocks_of`` tells where the driver believes a
  request's blocks are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from horizon.request import Request
from horizon.scheduler import never_fits_reason

Send = Callable[[tuple], None]


class _Blocks:
    """``kv.blocks_of`` and ``pool.block_size`` of a remote replica, as the driver knows them."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.held: dict[int, tuple[int, ...]] = {}  # request id -> block ids (or placeholders)

    def blocks_of(self, r: Request) -> Sequence[int]:
        return self.held.get(r.request_id, ())


class RemoteScheduler:
    """The driver's proxy of one worker's scheduler (see the module docstring).

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
        self.index = index
        self.num_blocks, self.max_model_len = num_blocks, max_model_len
        self.kv = self.pool = _Blocks(block_size)
        self.send = send
        self.free_blocks = free_blocks
        self.reported: list[tuple[Request, float]] = []  # handed off, not yet taken
        self.sent: dict[int, int] = {}  # imports sent, unanswered: request id -> blocks
        self.blocked = False  # refused since its latest report: offered nothing until the next

    # -- prefill replica -------------------------------------------------------------------------
    def handed_off(self, r: Request, n: int, blocks: tuple[int, ...], ready: float) -> None:
        """The worker handed ``r`` off with ``n`` tokens computed in ``blocks``."""
        r.set_computed(n)
        self.kv.held[r.request_id] = tuple(blocks)
        self.reported.append((r, ready))

    def take_handoffs(self) -> list[tuple[Request, float]]:
        out, self.reported = self.reported, []
        return out

    def release_handoff(self, r: Request) -> int:
        n = len(self.kv.held.pop(r.request_id))
        self.send(("release", r.request_id))
        return n

    # -- decode replica --------------------------------------------------------------------------
    def never_fits(self, r: Request) -> str:
        return never_fits_reason(r, self.kv.block_size, self.num_blocks, self.max_model_len)

    def import_blocks(self, r: Request) -> int:
        return -(-(r.num_computed_tokens + 1) // self.kv.block_size)

    def can_import(self, r: Request) -> bool:
        if self.blocked:
            return False
        free = self.free_blocks() - sum(self.sent.values())
        return not self.never_fits(r) and self.import_blocks(r) <= free

    def reserve_import(self, r: Request) -> None:
        """Count ``r``'s blocks as taken here (the driver then sends the import: the worker
        reserves, copies and admits, or refuses)."""
        n = self.import_blocks(r)
        self.sent[r.request_id] = n
        self.kv.held[r.request_id] = (-1,) * n

    def answered(self, r: Request, imported: bool) -> None:
        """The worker imported ``r`` (its blocks now count in its reports) or refused it."""
        del self.sent[r.request_id]
        if not imported:
            del self.kv.held[r.request_id]

    def finished(self, rid: int) -> None:
        """``rid`` finished or was dropped on this replica: it holds no blocks here any more."""
        self.kv.held.pop(rid, None)

    def check_integrity(self) -> None:
        assert all(rid in self.kv.held for rid in self.sent), "an import in flight holds nothing"
        assert all(n > 0 for n in self.sent.values())
