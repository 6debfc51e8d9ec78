"""A step's verifications when their acceptance is drawn ahead (``horizon.draft_track``): the
``StepPlan.verifies`` and ``StepResult.accepted`` of such steps, without a per-request list.

``DrawnVerifies`` is the sequence of ``(request, k)`` pairs a plan's ``verifies`` always is
(built on demand, O(requests)); its shape (drafts, context, attention pairs, tokens emitted)
comes from the tracks' per-step totals in O(1). It also carries the step's track events, for a
backend that follows the tracks (``simulator.drawn_stop``): tracks that start at this step
and tracks cut at it while their request keeps decoding. ``by_admission``: the step's
verifications are in admission order (the pool was short of blocks), else in speculating
order.

``DrawnAccepted`` is the result's ``accepted`` sequence: each verification's drawn count,
except ``capped`` (request id -> count) where the backend accepted fewer (a request's last
step under the trace's stopping rule).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from horizon.draft_track import DraftTrack
from horizon.request import Request


class DrawnVerifies(Sequence[tuple[Request, int]]):
    """The verifications of step ``step``: one per track in ``tracks`` (see module docstring)."""

    # totals: drafts, context, attention pairs, tokens emitted as drawn, (rejected blocks)
    __slots__ = ("step", "tracks", "started", "stopped", "by_admission", "totals")

    def __init__(
        self,
        step: int,
        tracks: tuple[DraftTrack, ...],
        started: tuple[DraftTrack, ...],
        stopped: tuple[DraftTrack, ...],
        by_admission: bool,
        totals: tuple[int, int, int, int, int],
    ) -> None:
        self.step = step
        self.tracks = tracks
        self.started = started
        self.stopped = stopped
        self.by_admission = by_admission
        self.totals = totals

    def __len__(self) -> int:
        return len(self.tracks)

    def __getitem__(self, i):  # noqa: ANN001, ANN204 - Sequence's int or slice
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.tracks)))]
        tr = self.tracks[i]
        return tr.req, tr.ks[self.step - tr.t0]

    def __iter__(self) -> Iterator[tuple[Request, int]]:
        t = self.step
        for tr in self.tracks:
            yield tr.req, tr.ks[t - tr.t0]

    def __repr__(self) -> str:
        return f"DrawnVerifies(step={self.step}, {list(self)!r})"

    @property
    def num_drafts(self) -> int:
        """Sum over verifications of ``k``."""
        return self.totals[0]

    @property
    def context_tokens(self) -> int:
        """Sum over verifications of the request's context (``num_computed_tokens``)."""
        return self.totals[1]

    @property
    def attention_pairs(self) -> int:
        return self.totals[2]

    @property
    def num_emitted(self) -> int:
        """Tokens the verifications emit as drawn (before any cap)."""
        return self.totals[3]

    @property
    def max_drafts(self) -> int:
        t = self.step
        return max((tr.ks[t - tr.t0] for tr in self.tracks), default=0)


class DrawnAccepted(Sequence[int]):
    """Accepted drafts per verification of ``verifies``: drawn, or ``capped`` by request id."""

    __slots__ = ("verifies", "capped")

    def __init__(self, verifies: DrawnVerifies, capped: dict[int, int]) -> None:
        self.verifies = verifies
        self.capped = capped

    def __len__(self) -> int:
        return len(self.verifies.tracks)

    def __getitem__(self, i):  # noqa: ANN001, ANN204
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        tr = self.verifies.tracks[i]
        a = self.capped.get(tr.req.request_id)
        return tr.accepted_at(self.verifies.step) if a is None else a

    def __iter__(self) -> Iterator[int]:
        for i in range(len(self)):
            yield self[i]
