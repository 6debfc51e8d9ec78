"""Speculative decoding with acceptance drawn ahead: the event-mode scheduler's steps stay
O(events) while requests speculate.

Used when the scheduler is given the backend's draws (``Scheduler(draws=)``, a
``horizon.spec_tracks.DrawSource``: the backend accepts exactly those, capped only by its
stopping rule, as the simulator's does) and the speculation policy is ``steady``. Each
speculating request then runs on a *track* (``horizon.draft_track``): its drafts and accepted
counts for up to a window of steps, drawn when it starts speculating and again when a track
runs out (where its draws end, or at the window). Its counters
follow the track (it is the request's anchor clock), its steps' totals are kept by step
(``horizon.spec_tracks``), its blocks grow at the steps the track says, and its tokens are
recorded when the track ends. A step then touches a speculating request only at its events:
a block it keeps, a track's end, its finish or preemption.

Everything else is the per-step mechanics of ``horizon.scheduler`` (same plans, records,
pool, drafts and acceptance; a test compares them byte for byte):

* the policy's ``k`` is asked every step; the token budget caps it alike for all requests
  (``k_eff``); when ``k_eff`` changes, every track is drawn again from that step;
* a step whose drafts and next tokens fit the free unreserved blocks with no reservation
  outstanding allocates, in one call each, the blocks the requests' tables keep and the
  blocks only rejected drafts use (held for the step, ``KVCacheManager.hold_drafts``, freed
  at the update as trimmed draft tails are); any other step runs the per-request mechanics
  (``_careful``): next-token blocks in admission order with preemption when the pool is
  short, draft tails from free blocks that shrink ``k`` (the request's track is then drawn
  again from that step) or make it a plain decode, trimmed at the update;
* the backend reports, for a request whose last step accepted fewer than drawn, that count
  (``DrawnAccepted.capped``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from horizon.draft_track import DraftTrack
from horizon.drawn_verifies import DrawnAccepted, DrawnVerifies
from horizon.plan import StepPlan, StepResult
from horizon.request import Request, RequestStatus
from horizon.spec_tracks import DrawSource, SpecTracks

if TYPE_CHECKING:
    from horizon.scheduler import Scheduler


def _track_admit_order(tr: DraftTrack) -> int:
    return tr.req.admit_seq


class DrawnSpeculation:
    """The drawn-ahead speculation of one event-mode ``Scheduler`` (see the module docstring).

    The scheduler calls ``choose`` at a step's start, ``plan`` after its decodes' blocks,
    ``verifies`` when the plan is built, ``verified`` in its update after the clock advanced,
    ``entered``/``forget`` when a request enters the anchored decode set or leaves running.
    """

    def __init__(self, sched: Scheduler, draws: DrawSource) -> None:
        self.s = sched
        self.tracks = SpecTracks(draws, sched.config.block_size, sched.clock)
        self.live: dict[int, DraftTrack] = {}  # speculating request id -> track, in order
        self.k_eff = 0  # the drafts every track proposes (capped by each output limit)
        self.fresh: list[Request] = []  # entered the anchored decode set since the last step
        self._seq = 0
        self.started: list[DraftTrack] = []  # events for the next plan
        self.stopped: list[DraftTrack] = []
        self.tails: list[Request] | None = None  # a per-request step's draft tails, in order
        self.held = 0  # blocks of drafts drawn to be rejected, held this step
        self.by_admission = False  # this step's verifications in admission order
        self.closed = False  # finish_run ended every track
        self._tot: tuple[int, int, int, int, int] | None = None  # this plan's totals, if kept

    # -- the step's drafts -----------------------------------------------------------------------
    def choose(self, t: int) -> None:
        """The policy's drafts for step ``t``: tracks ended or drawn again, requests that
        entered decoding start speculating."""
        s = self.s
        spec = s._speculating
        n = len(s._decoding) + len(spec)
        if n == 0:
            self.fresh.clear()
            return
        assert s.speculation is not None
        ks = s.speculation.draft_tokens(s._decodes() + tuple(spec.values()), s.view)
        if not isinstance(ks, int):
            raise RuntimeError(
                f"{type(s.speculation).__name__} is steady, so draft_tokens must return one "
                f"int for every request, got {ks!r}"
            )
        k_eff = _k_eff(ks, n, s.config.max_num_batched_tokens)
        if k_eff != self.k_eff:
            self._redraw_all(t, k_eff)
        else:
            self._renew(t)
        if k_eff > 0:
            for r in self.fresh:
                if r.request_id in s._decoding:
                    self._enter(r, t)
        self.fresh.clear()

    def _renew(self, t: int) -> None:
        """Tracks whose steps all ran: the next track, or a plain decode for the last token."""
        live = self.live
        ended = [tr for tr in self.tracks.ends(t) if live.get(tr.req.request_id) is tr]
        for tr in ended:
            self._close(tr, t)
        self._next_tracks(ended)

    def _redraw_all(self, t: int, k_eff: int) -> None:
        """``k_eff`` changed: every track is drawn again from step ``t`` (or ends)."""
        self.k_eff = k_eff
        self.tracks.ends(t)  # natural ends at t are among the tracks ended here
        ended = list(self.live.values())
        for tr in ended:
            self._stop(tr, t)
        self._next_tracks(ended)
        if k_eff > 0:
            for r in list(self.s._decoding.values()):
                self._enter(r, t)

    def _next_tracks(self, ended: list[DraftTrack]) -> None:
        """After ``ended`` (in speculating order): each request's next track, or a plain
        decode where its output limit leaves no draft (those join decoding after)."""
        leavers = []
        for tr in ended:
            r = tr.req
            k = min(self.k_eff, r.max_output_tokens - r.num_output_tokens - 1)
            if k >= 1:
                self._start(r, tr.seq, k)
            else:
                leavers.append(r)
        for r in leavers:
            self._leave(r)

    def _enter(self, r: Request, t: int) -> None:
        """A decoding request (anchored) starts speculating, if its output limit allows."""
        k = min(self.k_eff, r.max_output_tokens - r.num_output_tokens - 1)
        if k < 1:
            return
        s = self.s
        s.recorder.close_run(r, t - 1)  # it emitted at every step through the last
        s._unanchor(r)
        s._speculating[r.request_id] = r
        self._seq += 1
        self._start(r, self._seq, k)

    def _start(self, r: Request, seq: int, k_first: int) -> None:
        tr = self.tracks.start(r, seq, self.k_eff, k_first)
        r.anchor(tr)  # type: ignore[arg-type]  # a track is the request's clock
        self.live[r.request_id] = tr
        self.started.append(tr)

    def _close(self, tr: DraftTrack, at: int) -> None:
        """End ``tr`` before step ``at`` (the clock's step): record its tokens, settle."""
        r, m = tr.req, at - tr.t0
        if m:
            self.s.recorder.emit_steps(r, tr.t0, tr.cum, m)
        r.settle()
        self.tracks.cut(tr, at)

    def _stop(self, tr: DraftTrack, t: int) -> None:
        """End ``tr`` at step ``t`` while its request keeps decoding; the backend is told of
        a cut (not of a track's natural end)."""
        natural = tr.end == t
        self._close(tr, t)
        if natural:
            return
        if tr.t0 == t:
            self.started.remove(tr)
        else:
            self.stopped.append(tr)

    def _leave(self, r: Request) -> None:
        """A request with its track ended stops speculating: a plain decode."""
        del self.live[r.request_id]
        del self.s._speculating[r.request_id]
        self.s._enter_decode(r)

    # -- the step's blocks ----------------------------------------------------------------------
    def plan(self, t: int, budget: int, preempted: list[Request]) -> int:
        """Blocks for the speculating requests' step ``t``; returns the budget left."""
        n = len(self.live)
        if not n:
            self.by_admission = False
            self.tracks.drop_growth(t)
            return budget
        s = self.s
        tot = self._tot = self.tracks.totals(t, n)
        rejected = tot[4]
        grants, kept = self.tracks.growth(t)  # blocks kept; with the rejected ones, all needed
        need = rejected + kept
        if not s.ledger.active and need <= s.pool.num_free:
            if need:
                s.kv.grow_each(grants, kept, rejected)
                self.held = rejected
            self.by_admission = False
            return budget - n - tot[0]
        self._tot = None
        self._careful(t, need, preempted)
        self.tracks.drop_growth(t)  # of tracks drawn again here: allocated already
        return budget - n - self.tracks.totals(t, len(self.live))[0]

    def _careful(self, t: int, total: int, preempted: list[Request]) -> None:
        """The per-request mechanics of ``Scheduler._plan_verifies`` for step ``t``."""
        s = self.s
        kv, pool, ledger, bs, live = s.kv, s.pool, s.ledger, s._bs, self.live
        reqs = [tr.req for tr in live.values()]
        self.by_admission = s._next_token_blocks(reqs, total, preempted)
        tails = []
        for r in reqs:
            if r.status is not RequestStatus.RUNNING:
                continue  # preempted above
            tr = live[r.request_id]
            k0 = tr.ks[t - tr.t0]
            c, held = r.num_computed_tokens, len(kv.blocks_of(r))
            spare = max(0, pool.num_free - ledger.outstanding)
            k = min(k0, (held + spare) * bs - c - 1)
            if k <= 0:  # no block for a draft: a plain decode this step
                self._stop(tr, t)
                self._leave(r)
                continue
            if k < k0:  # fewer drafts than drawn: drawn again from this step
                self._stop(tr, t)
                self._start(r, tr.seq, k)
            nb = -(-(c + k + 1) // bs) - held
            ok = kv.allocate_drafts(r, nb)
            assert ok, "draft blocks were counted free"
            if nb:
                ledger.grew(r.request_id, nb)
                tails.append(r)
        self.tails = tails

    def verifies(self, t: int) -> DrawnVerifies | tuple[()]:
        """The plan's verifications (and the step's track events for the backend)."""
        if not self.live and not self.started and not self.stopped:
            return ()
        tracks = tuple(self.live.values())
        if self.by_admission:
            tracks = tuple(sorted(tracks, key=_track_admit_order))
        tot = self._tot
        if tot is None:
            tot = self.tracks.totals(t, len(tracks))
        self._tot = None
        v = DrawnVerifies(
            t, tracks, tuple(self.started), tuple(self.stopped), self.by_admission, tot
        )
        self.started.clear()
        self.stopped.clear()
        return v

    # -- update ----------------------------------------------------------------------------------
    def verified(self, plan: StepPlan, result: StepResult, t: int) -> None:
        """Account step ``t``'s verifications (the clock is at ``t + 1``): the backend's
        capped counts, draft tails trimmed or held drafts freed, the totals."""
        v = plan.verifies
        s = self.s
        fewer = 0
        if v.__class__ is DrawnVerifies:
            assert isinstance(v, DrawnVerifies)
            acc = result.accepted
            capped = acc.capped if acc.__class__ is DrawnAccepted else None  # type: ignore[attr-defined]
            if capped is None or capped:
                for rid, a in self._capped(v, result).items():
                    fewer += self.live[rid].cap(t, a)
        if self.tails is not None:
            kv, ledger = s.kv, s.ledger
            for r in self.tails:
                if r.status is RequestStatus.RUNNING:
                    trimmed = kv.trim(r)
                    if trimmed:
                        ledger.grew(r.request_id, -trimmed)
            self.tails = None
        if self.held:
            s.kv.release_held()
            self.held = 0
        if v.__class__ is not DrawnVerifies:
            return  # every speculating request was preempted or left in this step
        assert isinstance(v, DrawnVerifies)
        emitted = v.num_emitted - fewer
        s.tokens_emitted += emitted
        s.num_drafted += v.num_drafts
        s.num_accepted += emitted - len(v)
        s._verify_context = v.context_tokens

    def _capped(self, v: DrawnVerifies, result: StepResult) -> dict[int, int]:
        """Request id -> accepted drafts, where the backend accepted fewer than drawn (only
        at a request's last step)."""
        acc = result.accepted
        if acc.__class__ is DrawnAccepted:
            capped = acc.capped  # type: ignore[attr-defined]
        else:
            if len(acc) != len(v):
                raise RuntimeError(
                    f"StepResult.accepted has {len(acc)} counts for {len(v)} verifications"
                )
            capped = {}
            for tr, a in zip(v.tracks, acc):
                if int(a) != tr.accepted_at(v.step):
                    capped[tr.req.request_id] = int(a)
        if capped:
            done = {r.request_id for r in result.finished}
            for rid, a in capped.items():
                tr = self.live[rid]
                if rid not in done or not 0 <= a <= tr.accepted_at(v.step):
                    raise RuntimeError(
                        f"request {rid}: the backend accepted {a} drafts, the scheduler drew "
                        f"{tr.accepted_at(v.step)} (Scheduler acceptance=): only a request's "
                        "last step may accept fewer"
                    )
        return capped

    # -- requests entering and leaving -----------------------------------------------------------
    def entered(self, r: Request) -> None:
        """``r`` joined the anchored decode set: it may start speculating next step."""
        self.fresh.append(r)

    def forget(self, r: Request, told: bool = False) -> None:
        """``r`` leaves running (finished, preempted, aborted): its track ends at the clock's
        step. ``told``: the backend learns it from the next plan (an abort); a preemption
        and a finish it knows."""
        tr = self.live.pop(r.request_id, None)
        self.tracks.forget(r)
        if tr is None:
            return
        self._tot = None
        at = self.s.clock.step
        if self.held:  # mid-plan, after its drafts' blocks were held
            rejected = self.tracks.rejected_at(tr, at)
            if rejected:
                self.s.kv.release_held(rejected)
                self.held -= rejected
        self._close(tr, at)
        if tr.t0 == at and tr in self.started:
            self.started.remove(tr)
        elif told and at > tr.t0:
            self.stopped.append(tr)

    def finish_run(self) -> None:
        """The run is cut off: every track ends at the clock's step (tokens recorded)."""
        for tr in self.live.values():
            self._close(tr, self.s.clock.step)
        self.live.clear()
        self.closed = True

    def check_integrity(self) -> None:
        s = self.s
        assert not self.held and self.tails is None, "drafts held between steps"
        if self.closed:
            assert not self.live
            return
        assert list(self.live) == list(s._speculating), "tracks differ from speculating"
        for rid, tr in self.live.items():
            assert tr.req is s._speculating[rid] and tr.req._clock is tr, f"track of {rid}"
        self.tracks.check(list(self.live.values()))


def _k_eff(ks: int, n: int, max_tokens: int) -> int:
    """The drafts of every one of ``n`` decoding requests when the policy says ``ks``: capped
    alike when they would not fit the token budget (``Scheduler._choose_drafts``)."""
    if ks <= 0:
        return 0
    avail = max_tokens - n
    room = avail if ks * n <= avail else avail // n
    return max(0, min(ks, room))
