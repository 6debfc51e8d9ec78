"""A decode replica as a driver that knows it by its step reports places handoffs on it.

The engine cluster's driver places handed-off requests (``horizon.cluster.handoffs``) on decode
workers in other processes: it cannot read their schedulers, only their latest step report. So
``can_import`` is an estimate (the free blocks at the latest report, less the blocks of imports
sent since and not yet answered), ``reserve_import`` counts the blocks and sends the import, and
the worker decides when the import reaches it at its next step boundary: it reserves the blocks
if they fit then, or refuses (the request is pending again, and that replica is offered nothing
more until its next report). The simulator's ``placement="reported"`` places the same way over
its local decode schedulers (``simulator.reported_placement``); the engine's
``executor.remote_scheduler.RemoteScheduler`` is this class plus a prefill replica's side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from horizon.request import Request
from horizon.scheduler import never_fits_reason


class HeldBlocks:
    """``kv.blocks_of`` and ``pool.block_size`` of a replica, as the driver knows them."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.held: dict[int, tuple[int, ...]] = {}  # request id -> block ids (or placeholders)

    def blocks_of(self, r: Request) -> Sequence[int]:
        return self.held.get(r.request_id, ())


class ReportedImports:
    """The driver's view of one decode replica's imports (see the module docstring).

    Args:
        num_blocks, block_size, max_model_len: the replica's pool and limit.
        free_blocks: the replica's free blocks at its latest report.
    """

    def __init__(
        self, num_blocks: int, block_size: int, max_model_len: int, free_blocks: Callable[[], int]
    ) -> None:
        self.num_blocks, self.max_model_len = num_blocks, max_model_len
        self.kv = self.pool = HeldBlocks(block_size)
        self.free_blocks = free_blocks
        self.sent: dict[int, int] = {}  # imports sent, unanswered: request id -> blocks
        self.blocked = False  # refused since its latest report: offered nothing until the next

    def never_fits(self, r: Request) -> str:
        return never_fits_reason(r, self.kv.block_size, self.num_blocks, self.max_model_len)

    def import_blocks(self, r: Request) -> int:
        """Blocks ``r`` needs there: its transferred KV and its remaining prompt token."""
        return -(-(r.num_computed_tokens + 1) // self.kv.block_size)

    def can_import(self, r: Request) -> bool:
        if self.blocked:
            return False
        free = self.free_blocks() - sum(self.sent.values())
        return not self.never_fits(r) and self.import_blocks(r) <= free

    def reserve_import(self, r: Request) -> None:
        """Count ``r``'s blocks as taken there (the driver then sends the import: the replica
        reserves and admits, or refuses)."""
        n = self.import_blocks(r)
        self.sent[r.request_id] = n
        self.kv.held[r.request_id] = (-1,) * n

    def answered(self, r: Request, imported: bool) -> None:
        """The replica imported ``r`` (its blocks now count in its reports) or refused it; a
        refusal blocks the replica until ``reported``."""
        del self.sent[r.request_id]
        if not imported:
            del self.kv.held[r.request_id]
            self.blocked = True

    def reported(self) -> None:
        """A fresh step report: the replica is offered imports again."""
        self.blocked = False

    def finished(self, rid: int) -> None:
        """``rid`` finished or was dropped there: it holds no blocks there any more."""
        self.kv.held.pop(rid, None)

    def check_integrity(self) -> None:
        assert all(rid in self.kv.held for rid in self.sent), "an import in flight holds nothing"
        assert all(n > 0 for n in self.sent.values())
