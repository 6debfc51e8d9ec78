"""The simulator's draws ahead (``horizon.spec_tracks.DrawSource``): what its backend accepts at
each output position of a request, ``AcceptanceModel.hits`` over the positions its trace
reaches (``0 .. true_output_tokens - 1``: it verifies nothing past its last token).

Computed for ``block`` requests at a time, in arrival order (the order they will need them),
in one vectorised pass; a request not in the run's list gets its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from horizon.acceptance import AcceptanceModel
from horizon.request import Request


class TraceDraws:
    """Draws of ``acceptance`` for ``requests`` (see the module docstring)."""

    def __init__(
        self, acceptance: AcceptanceModel, requests: Sequence[Request], block: int = 64
    ) -> None:
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"TraceDraws.block must be an int >= 1, got {block!r}")
        self.acceptance = acceptance
        order = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
        self._blocks = [order[i : i + block] for i in range(0, len(order), block)]
        self._members = list(self._blocks)  # kept for ``peers`` (``_blocks`` empties)
        self._peered = [False] * len(self._blocks)
        self._block_of = {r.request_id: i // block for i, r in enumerate(order)}
        self._hits: dict[int, tuple[int, list[int]]] = {}  # id -> (kmax, hits from 0)

    def draws(self, r: Request, start: int, kmax: int) -> tuple[int, list[int]]:
        rid = r.request_id
        got = self._hits.get(rid)
        if got is None or got[0] != kmax:
            batch = [r]
            b = self._block_of.get(rid)
            if b is not None and self._blocks[b]:  # with the rest of its block, once
                hits = self._hits
                batch += [q for q in self._blocks[b] if q is not r and q.request_id not in hits]
                self._blocks[b] = []
            self._fill(batch, kmax)
            got = self._hits[rid]
        return 0, got[1]

    def forget(self, r: Request) -> None:
        self._hits.pop(r.request_id, None)

    def peers(self, r: Request) -> list[Request]:
        """The requests of ``r``'s block, the first time one of them asks (then ``[r]``)."""
        b = self._block_of.get(r.request_id)
        if b is None or self._peered[b]:
            return [r]
        self._peered[b] = True
        return self._members[b]

    def _fill(self, reqs: list[Request], kmax: int) -> None:
        lengths = [r.true_output_tokens for r in reqs]
        flat = self.acceptance.hits_many([r.request_id for r in reqs], lengths, kmax).tolist()
        i = 0
        for r, n in zip(reqs, lengths):
            self._hits[r.request_id] = (kmax, flat[i : i + n])
            i += n
