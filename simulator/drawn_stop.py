"""The trace's stopping rule for plans whose acceptance is drawn ahead (``horizon.draft_track``).

``horizon.trace_stop.TraceStop`` reads every verification of every step: it caps the step's
accepted drafts at the trace's end and, after each verification, files the request under the
step it would finish at if it decoded plainly from then on (its *estimate*; requests finishing
at one step are reported in the order they were filed). ``DrawnStop`` gives the same finished
requests in the same order while reading only the plans' track events: when a track starts
it finds the step at which the track reaches the trace's end (the request then finishes by a
verification, with its accepted drafts capped there) or, failing that, the estimate the
track's last step leaves and the step that first filed it; when a track is cut it files the
estimate of the last step that ran; when a request is preempted, every estimate its tracks
filed before (a later finish at one of those steps is ordered by that filing, as
``TraceStop``'s list is).

A filing is keyed ``(step, phase, order)``: prefills that end at ``step`` are filed first
(phase 0, in the plan's order), then verifications (phase 1, in the plan's order: speculating
order, or admission order in a step short of blocks, ``DrawnVerifies.by_admission``).
"""

from __future__ import annotations

from bisect import bisect_left

from horizon.draft_track import DraftTrack
from horizon.drawn_verifies import DrawnVerifies
from horizon.plan import StepPlan
from horizon.request import Request

# a filing: (step filed, phase, plan index (phase 0), speculating seq, admission seq, request,
# the track it was drawn on (None: filed by a step that ran))
_Filing = tuple[int, int, int, int, int, Request, DraftTrack | None]


class DrawnStop:
    """``finished(plan) -> (finished requests, capped)``: the plan's requests that emit their
    last trace token in this step, in ``TraceStop``'s order, and the accepted drafts of
    those finishing by a verification. Call once per executed plan, in order, before
    ``Scheduler.update`` (event mode)."""

    def __init__(self) -> None:
        self._finish_at: dict[int, int] = {}  # request id -> its estimate
        self._filed: dict[int, list[_Filing]] = {}  # step -> filings of that estimate
        self._last: dict[int, tuple[DraftTrack, int]] = {}  # id -> track, its finishing step
        self._due: dict[int, list[DraftTrack]] = {}  # step -> tracks finishing there
        self._tracks: dict[int, list[DraftTrack]] = {}  # id -> tracks since its prefill
        self._by_admission: set[int] = set()  # steps whose verifications were in that order

    def finished(self, plan: StepPlan) -> tuple[list[Request], dict[int, int]]:
        t = plan.step
        done: list[Request] = []
        capped: dict[int, int] = {}
        if plan.preempted:
            for r in plan.preempted:
                self._preempted(r, t)
        filed, finish_at = self._filed, self._finish_at
        for i, (r, n) in enumerate(plan.prefills) if plan.prefills else ():
            if r.num_computed_tokens + n == r.num_tokens:  # the chunk ends a prefill: a token
                left = r.true_output_tokens - r.num_output_tokens - 1
                if left == 0:
                    done.append(r)
                else:
                    finish_at[r.request_id] = t + left
                    filed.setdefault(t + left, []).append((t, 0, i, 0, 0, r, None))
        v = plan.verifies
        if v.__class__ is DrawnVerifies:
            assert isinstance(v, DrawnVerifies)
            self._events(v)
            if t in self._due:
                self._verified(v, done, capped)
        due = filed.pop(t, None)
        if due:
            if len(due) > 1:
                due.sort(key=self._order)
            for f in due:
                r, tr = f[5], f[6]
                if tr is not None and f[0] >= tr.end:
                    continue  # drawn, but its track was cut before that step
                if finish_at.get(r.request_id) == t:
                    del finish_at[r.request_id]
                    done.append(r)
        if done and self._tracks:
            for r in done:
                self._tracks.pop(r.request_id, None)
        return done, capped

    def _order(self, f: _Filing) -> tuple[int, int, int]:
        return f[0], f[1], (f[4] if f[0] in self._by_admission else f[3]) if f[1] else f[2]

    def _events(self, v: DrawnVerifies) -> None:
        if v.by_admission:
            self._by_admission.add(v.step)
        if v.stopped:
            for tr in v.stopped:
                self._cut(tr)
        if v.started:
            for tr in v.started:
                self._start(tr)

    def _verified(self, v: DrawnVerifies, done: list[Request], capped: dict[int, int]) -> None:
        """Verifications reaching the trace's end at this step, in the plan's order."""
        t = v.step
        due = self._due.pop(t, None)
        if not due:
            return
        last = self._last
        mine = [tr for tr in due if last.get(tr.req.request_id, (None, 0)) == (tr, t)]
        if len(mine) > 1:
            mine.sort(key=_by_admission if v.by_admission else _by_seq)
        for tr in mine:
            r = tr.req
            del last[r.request_id]
            j = t - tr.t0
            capped[r.request_id] = r.true_output_tokens - tr.g0 - tr.cum[j] - 1
            done.append(r)

    def _start(self, tr: DraftTrack) -> None:
        r = tr.req
        rid, left, cum, n = r.request_id, r.true_output_tokens - tr.g0, tr.cum, len(tr.ks)
        self._tracks.setdefault(rid, []).append(tr)
        self._last.pop(rid, None)
        if cum[n] >= left:  # reaches the trace's end at its step j
            j = bisect_left(cum, left, 1) - 1
            self._last[rid] = (tr, tr.t0 + j)
            self._due.setdefault(tr.t0 + j, []).append(tr)
            self._finish_at.pop(rid, None)
            return
        est = tr.t0 + n - 1 + left - cum[n]
        self._finish_at[rid] = est
        self._file(tr, est, _first_filing(cum, n), tr)

    def _cut(self, tr: DraftTrack) -> None:
        """``tr`` ran steps ``t0 .. end - 1``; its request decodes on from its estimate."""
        r = tr.req
        rid, m = r.request_id, tr.end - tr.t0
        if self._last.get(rid, (None, 0))[0] is tr:
            del self._last[rid]
        est = tr.end - 1 + r.true_output_tokens - tr.g0 - tr.cum[m]
        self._finish_at[rid] = est
        self._file(tr, est, _first_filing(tr.cum, m), None)

    def _preempted(self, r: Request, t: int) -> None:
        """Every estimate ``r``'s tracks filed stays filed (``TraceStop``'s list keeps them)."""
        rid = r.request_id
        self._finish_at.pop(rid, None)
        self._last.pop(rid, None)
        for tr in self._tracks.pop(rid, ()):
            left, prev = r.true_output_tokens - tr.g0, None
            for j in range(min(tr.end, t) - tr.t0):
                est = tr.t0 + j + left - tr.cum[j + 1]
                if est != prev and est > t:
                    self._file(tr, est, j, None)
                prev = est

    def _file(self, tr: DraftTrack, est: int, j: int, drawn: DraftTrack | None) -> None:
        r = tr.req
        f = (tr.t0 + j, 1, 0, tr.seq, r.admit_seq, r, drawn)
        self._filed.setdefault(est, []).append(f)


def _first_filing(cum: list[int], m: int) -> int:
    """The first of steps ``0 .. m - 1`` whose estimate is step ``m - 1``'s: an estimate
    drops by a step's accepted drafts, so back over the steps that accepted none."""
    j = m - 1
    while j > 0 and cum[j + 1] - cum[j] == 1:
        j -= 1
    return j


def _by_seq(tr: DraftTrack) -> int:
    return tr.seq


def _by_admission(tr: DraftTrack) -> int:
    return tr.req.admit_seq
