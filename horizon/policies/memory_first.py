"""Memory-first: admit a request only if it fits to completion, so nothing is ever preempted.

A request is admitted only if its prompt plus ``max_output_tokens`` fits in the free blocks left
after every running request's own reservation. Since reservations cover each running request's
worst case, allocation never fails and no preemption happens (a property the tests check).
"""

from __future__ import annotations

from horizon.kv_cache import KVView
from horizon.policies.base import Policy
from horizon.request import Request


class MemoryFirst(Policy):
    name = "memory_first"

    def reserve_tokens(self, req: Request) -> int:
        return req.num_prompt_tokens + req.max_output_tokens

    def admit(self, req: Request, view: KVView) -> bool:
        need = view.blocks_to_admit(req, self.reserve_tokens(req))
        return need <= view.num_free_blocks - view.num_reserved_blocks
