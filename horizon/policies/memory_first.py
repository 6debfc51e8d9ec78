"""Memory-first: admit a request only if its reservation fits, reserving to completion.

A request's reservation is its prompt plus an output cap, and it is admitted only if that fits
in the free blocks left after every running request's own reservation.

* Without a predictor (the default) the cap is ``max_output_tokens``: reservations cover each
  running request's worst case, so allocation never fails and nothing is ever preempted (a
  property the tests check), at the price of admitting few requests at once.
* With a ``predictor``, the cap is the ``quantile`` of the request's predicted total output,
  rounded up and never above ``max_output_tokens``; for a request readmitted after a
  preemption, the quantile of the total given the tokens it has emitted. With the ``mean``
  predictor (trained on the train split) that is the training split's ``quantile`` of output
  lengths, the same for every new request. A request that outgrows its cap takes blocks nobody
  reserved, so preemption (of the latest arrival, the base rule) becomes possible.

``reservation`` states the cap in tokens: the least and most reserved for the requests admitted
so far (a policy serves one run).
"""

from __future__ import annotations

import math

from horizon.kv_cache import KVView
from horizon.policies.base import Policy
from horizon.prediction import LengthPredictor
from horizon.request import Request


class MemoryFirst(Policy):
    name = "memory_first"

    def __init__(self, predictor: LengthPredictor | None = None, quantile: float = 0.99) -> None:
        if isinstance(quantile, bool) or not (
            isinstance(quantile, (int, float)) and 0 < quantile <= 1
        ):
            raise ValueError(f"memory_first.quantile must be in (0, 1], got {quantile!r}")
        self.predictor = predictor
        self.quantile = float(quantile)
        if predictor is not None:
            self.reads_true_length = predictor.reads_true_length
        self._cap_range: tuple[int, int] | None = None  # least, most output tokens reserved

    def output_cap(self, req: Request) -> int:
        """Output tokens reserved for ``req`` (emitted ones included), <= max_output_tokens."""
        if self.predictor is None:
            return req.max_output_tokens
        g = req.num_output_tokens
        rest = self.predictor.update(req, g).quantile(self.quantile)
        return min(req.max_output_tokens, g + math.ceil(rest))

    def reserve_tokens(self, req: Request) -> int:
        cap = self.output_cap(req)
        lo, hi = self._cap_range or (cap, cap)
        self._cap_range = (min(lo, cap), max(hi, cap))
        return req.num_prompt_tokens + cap

    def admit(self, req: Request, view: KVView) -> bool:
        need = view.blocks_to_admit(req, req.num_prompt_tokens + self.output_cap(req))
        return need <= view.num_free_blocks - view.num_reserved_blocks

    @property
    def reservation(self) -> dict[str, object]:
        """The cap's rule and the output tokens reserved at admissions so far (least and most;
        None before the first admission)."""
        lo, hi = self._cap_range or (None, None)
        rule = "max_output_tokens" if self.predictor is None else f"q{self.quantile:g}"
        return {"output_cap": rule, "min_output_tokens": lo, "max_output_tokens": hi}
