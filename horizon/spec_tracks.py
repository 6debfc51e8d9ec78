"""The live draft tracks of one scheduler: drawn ahead, their steps' sums kept by step.

The draws come from a ``DrawSource``: the backend's promise of what it will accept at each of
a request's output positions. ``ModelDraws`` draws them from the acceptance model, a chunk of
positions at a time; a backend that knows how far a request can go (the simulator: its trace)
may give fewer (``simulator.trace_draws``). A track runs up to ``window`` steps and as far as
its request's draws go; where they end, the next track continues (the same plans follow,
whatever the draws' extent).

``start`` draws a request's track (``horizon.draft_track``) from the acceptance model and
adds what it does at each of its steps to per-step sums (context tokens, tokens emitted,
blocks only rejected drafts use, blocks the tables keep, and corrections where a step's ``k``
is not the tracks' ``k_eff``), so a step reads its speculating requests' shape in O(1)
(``totals``); ``cut`` takes a track's remaining steps back out. A calendar keyed by step says
which tracks' last steps pass (``ends``); entries of cut tracks stay in it and are skipped
when their step comes (a track's ``end`` says how far it ran).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from horizon.acceptance import AcceptanceModel
from horizon.draft_track import (
    CONTEXT,
    EMITTED,
    KEPT,
    REJECTED,
    DraftTrack,
    chase,
    shape_many,
    track_shape,
)
from horizon.request import Request, StepClock

HIT_CHUNK = 512  # output positions whose draws ModelDraws computes at once per request


class DrawSource(Protocol):
    """What the backend will accept, drawn ahead."""

    def draws(self, r: Request, start: int, kmax: int) -> tuple[int, list[int]]:
        """``(base, hits)``: ``hits[g - base]`` (``<= kmax``) drafts of a verification of
        ``kmax`` (``min`` with a smaller ``k``) are accepted at ``r``'s output position ``g``,
        for ``base <= g < base + len(hits)``; ``start`` is among them."""

    def forget(self, r: Request) -> None:
        """``r`` is done: its draws need not be kept."""

    # optional: ``peers(r) -> Sequence[Request]``, the requests whose draws were drawn with
    # ``r``'s (once: later calls for any of them give none); their first tracks are then
    # drawn together (``SpecTracks``)


class ModelDraws:
    """``DrawSource`` of an acceptance model: ``HIT_CHUNK`` positions a request at a time."""

    def __init__(self, acceptance: AcceptanceModel) -> None:
        self.acceptance = acceptance
        self._hits: dict[int, tuple[int, int, list[int]]] = {}  # id -> (base, kmax, hits)

    def draws(self, r: Request, start: int, kmax: int) -> tuple[int, list[int]]:
        rid = r.request_id
        hit = self._hits.get(rid)
        if hit is not None:
            base, k, hits = hit
            if base <= start < base + len(hits) and k == kmax:
                return base, hits
        stop = min(r.max_output_tokens - 1, start + HIT_CHUNK)
        hits = self.acceptance.hits(rid, start, stop, kmax).tolist()
        self._hits[rid] = (start, kmax, hits)
        return start, hits

    def forget(self, r: Request) -> None:
        self._hits.pop(r.request_id, None)


class SpecTracks:
    """Tracks of up to ``window`` steps, all drawn with one ``k_eff``; per-step sums from the
    clock's step on."""

    def __init__(
        self, source: DrawSource, block_size: int, clock: StepClock, window: int = 512
    ) -> None:
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"SpecTracks.window must be an int >= 1, got {window!r}")
        self.source = source
        self.block_size = block_size
        self.clock = clock
        self.window = window
        self.k_eff = 0  # of every live track
        self._base = 0  # the step of _rows[:, 0]
        self._rows = np.zeros((4, 4 * window), dtype=np.int64)
        self._corr: dict[int, list[int]] = {}  # step -> [drafts, pairs] off the k_eff sums
        self._ends: dict[int, list[DraftTrack]] = {}
        self._grow: dict[int, list[tuple[DraftTrack, int]]] = {}  # step -> (track, blocks kept)
        # first tracks drawn ahead with their peers (the source's ``peers``): id -> (its
        # counters, k_eff and first drafts, drafts, cumulative tokens, shape)
        self._first: dict[int, tuple] = {}
        self._peers = getattr(source, "peers", None)

    # -- tracks ----------------------------------------------------------------------------------
    def start(self, r: Request, seq: int, k_eff: int, k_first: int) -> DraftTrack:
        """Draw ``r``'s track from the clock's step (``r`` settled, decoding, ``1 <= k_first
        <= k_eff``, ``k_eff`` that of every live track), add its steps to the sums and its
        end to the calendar."""
        t, g0, c0 = self.clock.step, r.num_output_tokens, r.num_computed_tokens
        key = (g0, c0, k_eff, k_first)
        if g0 == 1 and r.request_id not in self._first and self._peers is not None:
            self._prepare(self._peers(r), k_eff)
        first = self._first.pop(r.request_id, None)
        self.k_eff = k_eff
        if first is not None and first[0] == key:  # drawn and shaped with its peers
            _, ks, cum, (rows, corr, at, grown) = first
            tr = DraftTrack(r, seq, t, ks, cum, self.clock, c0, g0)
            tr.rows, tr.corr = rows, corr
        else:
            base, draws = self.source.draws(r, g0, k_eff)
            ks, cum = chase(draws, base, g0, r.max_output_tokens, k_eff, k_first, self.window)
            assert ks, f"request {r.request_id}: a track without a step"
            tr = DraftTrack(r, seq, t, ks, cum, self.clock, c0, g0)
            track_shape(tr, k_eff, self.block_size)
            kept = tr.rows[KEPT]
            js = np.flatnonzero(kept)
            at, grown = js.tolist(), kept[js].tolist()
        i = t - self._base
        if tr.end - self._base > self._rows.shape[1]:
            i = self._room(t, tr.end)
        self._rows[:, i : i + len(ks)] += tr.rows
        if tr.corr:
            self._correct(tr, 0, 1)
        ends = self._ends.get(tr.end)
        if ends is None:
            self._ends[tr.end] = [tr]
        else:
            ends.append(tr)
        self._file_growth(tr, at, grown)
        return tr

    def _file_growth(self, tr: DraftTrack, at: list[int], grown: list[int]) -> None:
        """File the steps at which ``tr``'s table keeps blocks (``at``, from its first step:
        the nonzero entries of its ``KEPT`` row, ``grown``), by step."""
        grow, t0 = self._grow, tr.t0
        get = grow.get
        for j, n in zip(at, grown):
            s = j + t0
            g = get(s)
            if g is None:
                grow[s] = [(tr, n)]
            else:
                g.append((tr, n))

    def cut(self, tr: DraftTrack, at: int) -> None:
        """``tr`` stops before step ``at`` (``t0 <= at <= end``): its later steps leave the
        sums."""
        assert tr.t0 <= at <= tr.end, f"cut at {at} outside {tr.t0}..{tr.end}"
        m = at - tr.t0
        if at < tr.end:
            i = at - self._base
            self._rows[:, i : i + tr.end - at] -= tr.rows[:, m : tr.end - tr.t0]
            if tr.corr:
                self._correct(tr, m, -1)
        tr.end = at

    def forget(self, r: Request) -> None:
        """``r`` left the scheduler: its draws need not be kept."""
        self.source.forget(r)
        self._first.pop(r.request_id, None)

    def _prepare(self, peers: Sequence[Request], k_eff: int) -> None:
        """First tracks of ``peers`` (drawn with each other), drawn and shaped at once: from
        their first decode (one token out, the prompt computed) with ``k_eff`` drafts."""
        todo, inputs = [], []
        for q in peers:
            k_first = min(k_eff, q.max_output_tokens - 2)
            if k_first < 1 or q.request_id in self._first:
                continue
            base, draws = self.source.draws(q, 1, k_eff)
            ks, cum = chase(draws, base, 1, q.max_output_tokens, k_eff, k_first, self.window)
            if ks:
                todo.append((q, (1, q.num_prompt_tokens, k_eff, k_first), ks, cum))
                inputs.append((ks, cum, q.num_prompt_tokens))
        if todo:
            for (q, key, ks, cum), shaped in zip(todo, shape_many(inputs, k_eff, self.block_size)):
                self._first[q.request_id] = (key, ks, cum, shaped)

    # -- per step --------------------------------------------------------------------------------
    def totals(self, t: int, n: int) -> tuple[int, int, int, int, int, int]:
        """Step ``t``'s sums over its ``n`` live tracks: drafts, context tokens, attention
        pairs, tokens emitted (as drawn), blocks only rejected drafts use, blocks the
        requests' tables keep."""
        i = t - self._base
        if i >= self._rows.shape[1] or not n:
            return 0, 0, 0, 0, 0, 0
        ctx, emitted, rejected, kept = self._rows[:, i].tolist()
        q = self.k_eff + 1
        drafts, pairs = n * self.k_eff, q * ctx + n * (q * (q + 1) // 2)
        c = self._corr.get(t)
        if c is not None:
            drafts += c[0]
            pairs += c[1]
        return drafts, ctx, pairs, emitted, rejected, kept

    def growth(self, t: int) -> tuple[list[tuple[Request, int]], int]:
        """The blocks the live tracks' tables keep from step ``t``: ``(request, n)`` per track
        that keeps any (entries of tracks cut by ``t`` skipped), and their total; consumed."""
        filed = self._grow.pop(t, None)
        if not filed:
            return [], 0
        grants = [(tr.req, n) for tr, n in filed if t < tr.end]
        return grants, sum(n for _, n in grants)

    def drop_growth(self, t: int) -> None:
        """Step ``t``'s blocks were allocated per request (``DrawnSpeculation._careful``):
        its filed growth is dropped."""
        self._grow.pop(t, None)

    def ends(self, t: int) -> list[DraftTrack]:
        """Tracks whose steps all ran by step ``t`` (not cut earlier), in speculating order
        (a track cut at its natural end is among them: callers check it is live)."""
        ev = self._ends.pop(t, None)
        if not ev:
            return []
        out = [tr for tr in ev if tr.end == t]
        if len(out) > 1:
            out.sort(key=_by_seq)
        return out

    def rejected_at(self, tr: DraftTrack, t: int) -> int:
        """Blocks only ``tr``'s rejected drafts use at step ``t``."""
        return int(tr.rows[REJECTED, t - tr.t0])

    # -- internals -------------------------------------------------------------------------------
    def _correct(self, tr: DraftTrack, m: int, sign: int) -> None:
        """Add (``sign`` 1) or take out (-1) ``tr``'s corrections at its steps ``>= m``."""
        corr, t0 = self._corr, tr.t0
        for j, dk, dp in tr.corr:
            if j < m:
                continue
            c = corr.get(t0 + j)
            if c is None:
                corr[t0 + j] = [sign * dk, sign * dp]
            else:
                c[0] += sign * dk
                c[1] += sign * dp
                if c == [0, 0]:
                    del corr[t0 + j]

    def _room(self, t: int, end: int) -> int:
        """The column of step ``t`` once columns reach step ``end``; drops those before the
        clock."""
        rows = self._rows
        cap = rows.shape[1]
        if end - self._base > cap:
            shift = self.clock.step - self._base
            if shift >= cap:
                rows[:] = 0
            elif shift:
                rows[:, : cap - shift] = rows[:, shift:]
                rows[:, cap - shift :] = 0
            self._base += shift
            self._corr = {s: c for s, c in self._corr.items() if s >= self._base}
            need = end - self._base
            if need > cap:
                grown = np.zeros((4, max(need, 2 * cap)), dtype=np.int64)
                grown[:, :cap] = rows
                self._rows = grown
        return t - self._base

    def check(self, live: list[DraftTrack]) -> None:
        """The current step's sums are the live tracks' there."""
        t = self.clock.step
        want = [0, 0, 0, 0, 0, 0]
        n = 0
        for tr in live:  # a track whose steps all ran ends at the next plan (``ends``)
            assert tr.t0 <= t <= tr.end, f"track of {tr.req.request_id} not live at step {t}"
            if t == tr.end:
                continue
            j, k = t - tr.t0, tr.ks[t - tr.t0]
            c = int(tr.rows[CONTEXT, j])
            n += 1
            for col, v in enumerate(
                (k, c, (k + 1) * c + (k + 1) * (k + 2) // 2, int(tr.rows[EMITTED, j]))
            ):
                want[col] += v
            want[4] += int(tr.rows[REJECTED, j])
            want[5] += int(tr.rows[KEPT, j])
        if n:
            assert want == list(self.totals(t, n)), "speculating sums differ from their tracks"


def _by_seq(tr: DraftTrack) -> int:
    return tr.seq
