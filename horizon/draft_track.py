"""A speculating request's next steps, drawn ahead: its drafts and accepted counts per step.

When the backend's acceptance is a known, seeded function of (request, output position, k)
(``horizon.acceptance``: the simulator's), the scheduler need not wait for each step's result
to know how a speculating request advances: from its counters at step ``t0`` it draws the
accepted count of every step of a *track* (up to ``window`` steps), each step's ``k`` being the
policy's (capped by the request's output limit, as the scheduler caps it). The track then
serves as the request's anchor clock (``Request.anchor``), so its counters read exactly at
every step without being touched, and its block growth and draft blocks are known in advance.

    step       t0      t0+1     ...   t0+J-1        (J = len(ks) steps, J <= window)
    drafts     ks[0]   ks[1]          ks[J-1]
    emitted    cum[1]-cum[0]  ...     cum[J]-cum[J-1]     (accepted drafts + 1; cum[0] = 0)

A track is cut (``end`` < ``t0 + J``) when something the draws did not know happens: the
request is preempted, finishes (its trace's last step may accept fewer: ``cap``), runs out of
free blocks for its drafts, or the policy's ``k`` changes.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from horizon.request import Request, StepClock

# the per-step sums a track adds to its steps (``SpecTracks``), dense: context tokens, tokens
# emitted, blocks only rejected drafts use (allocated with the step, freed at its update) and
# blocks the request's table keeps from the step (its next token's and those its accepted
# drafts fill); drafts and attention pairs follow from the context where ``k`` is the
# tracks' ``k_eff``, and steps where it is not carry corrections (``DraftTrack.corr``)
CONTEXT, EMITTED, REJECTED, KEPT = range(4)
_NO_ROWS = np.zeros((4, 0), dtype=np.int64)


class DraftTrack:
    """One request's drafts and accepted counts at steps ``t0 .. end - 1`` (see the module
    docstring). ``seq``: the request's place in the scheduler's speculating order."""

    __slots__ = ("req", "seq", "t0", "end", "ks", "cum", "c0", "g0", "clock", "rows", "corr")

    def __init__(
        self,
        req: Request,
        seq: int,
        t0: int,
        ks: list[int],
        cum: list[int],
        clock: StepClock,
        c0: int,
        g0: int,
    ) -> None:
        self.req = req
        self.seq = seq
        self.t0 = t0
        self.end = t0 + len(ks)
        self.ks = ks
        self.cum = cum
        self.c0 = c0  # the request's counters at t0
        self.g0 = g0
        self.clock = clock
        self.rows: np.ndarray = _NO_ROWS  # per step, see CONTEXT (``track_shape``)
        self.corr: list[tuple[int, int, int]] = []  # (j, drafts, pairs) off the k_eff sums

    @property
    def step(self) -> int:
        """The request's anchor clock: ``t0`` plus the tokens emitted since ``t0`` (so that
        ``Request``'s drift is those tokens)."""
        return self.t0 + self.cum[self.clock.step - self.t0]

    def drafts_at(self, t: int) -> int:
        return self.ks[t - self.t0]

    def accepted_at(self, t: int) -> int:
        j = t - self.t0
        return self.cum[j + 1] - self.cum[j] - 1

    def cap(self, t: int, accepted: int) -> int:
        """Step ``t`` (the track's last: the request finishes) accepted ``accepted`` drafts,
        fewer than drawn or as many; returns how many fewer tokens it emitted than drawn."""
        j = t - self.t0
        assert 0 <= accepted <= self.accepted_at(t), f"request {self.req.request_id}: cap"
        fewer = self.cum[j + 1] - (self.cum[j] + accepted + 1)
        self.cum[j + 1] -= fewer
        return fewer


def chase(
    hits: list[int], base: int, g0: int, max_output: int, k_eff: int, k_first: int, window: int
) -> tuple[list[int], list[int]]:
    """The drafts and cumulative tokens of a track from output position ``g0``: each step
    proposes ``min(k_eff, max_output - g - 1)`` drafts (``k_first`` at the first) and accepts
    ``min(hits[g - base], k)`` of them (``hits`` drawn for ``k_eff`` drafts: at most that);
    it stops after ``window`` steps, where ``k`` would be 0 (the request's last token is a
    plain decode) or where ``hits`` end."""
    top = base + len(hits)
    if g0 >= top or k_first <= 0:
        return [], [0]
    a = hits[g0 - base]  # the first step: k_first drafts
    g = g0 + (a if a < k_first else k_first) + 1
    cum = [0, g - g0]
    # then k_eff drafts while the output limit allows (g <= lim): the draws need no cap
    p, stop, c = g - base, min(max_output - 1 - k_eff, top - 1) - base, g - g0
    append = cum.append
    if stop - p < window - 1:  # a step takes at least one position: the window cannot end it
        while p <= stop:
            d = hits[p] + 1
            p += d
            c += d
            append(c)
    else:
        while p <= stop and len(cum) <= window:
            d = hits[p] + 1
            p += d
            c += d
            append(c)
    n = len(cum) - 1
    ks = [k_first] + [k_eff] * (n - 1)
    g = base + p
    while n < window and g < top:  # the last drafts, fewer than k_eff
        k = max_output - g - 1
        if k <= 0:
            break
        a = hits[g - base]
        g += (a if a < k else k) + 1
        ks.append(k)
        append(g - g0)
        n += 1
    return ks, cum


def track_shape(tr: DraftTrack, k_eff: int, block_size: int) -> None:
    """Set ``tr.rows`` (per step: context, tokens emitted, blocks only rejected drafts use,
    blocks its table keeps) and ``tr.corr`` (steps whose ``k`` is not ``k_eff``: the
    differences in drafts and in causal attention pairs, ``(k + 1) * context + (k + 1) * (k +
    2) / 2``)."""
    bs, ks, n, c0 = block_size, tr.ks, len(tr.ks), tr.c0
    x = np.array(tr.cum, dtype=np.int64)  # tokens emitted before each step (and after the last)
    blocks = x + (c0 + bs - 1)
    blocks //= bs  # blocks held before each step (and kept after the last)
    rows = np.empty((4, n), dtype=np.int64)
    head, tail = x[:-1], x[1:]
    np.add(head, c0, out=rows[CONTEXT])
    np.subtract(tail, head, out=rows[EMITTED])
    rej = rows[REJECTED]  # blocks for context + k + 1 tokens, beyond those kept after
    tr.corr = _corrections(ks, tr.cum, c0, k_eff)
    if tr.corr:
        np.add(head, np.array(ks, dtype=np.int64) + (c0 + bs), out=rej)
    else:
        np.add(head, c0 + k_eff + bs, out=rej)
    after = blocks[1:]
    rej //= bs
    rej -= after
    np.subtract(after, blocks[:-1], out=rows[KEPT])
    tr.rows = rows


# per track: its rows, its corrections, and the steps (from its first) whose KEPT is not 0
# with those KEPT values
Shaped = tuple[np.ndarray, list[tuple[int, int, int]], list[int], list[int]]


def shape_many(tracks: list[tuple[list[int], list[int], int]], k_eff: int, bs: int) -> list[Shaped]:
    """``track_shape`` of several tracks ``(ks, cum, c0)`` at once, in one vectorised pass: per
    track its rows, its corrections and the steps at which its table keeps blocks."""
    n = np.fromiter((len(ks) for ks, _, _ in tracks), np.int64, len(tracks))
    total = int(n.sum())
    x = np.fromiter(chain.from_iterable(cum for _, cum, _ in tracks), np.int64, total + len(n))
    x += np.repeat(np.fromiter((c for _, _, c in tracks), np.int64, len(n)), n + 1)
    blocks = x + (bs - 1)
    blocks //= bs
    last = np.cumsum(n + 1) - 1
    head = np.ones(len(x), dtype=bool)
    head[last] = False
    tail = np.ones(len(x), dtype=bool)
    tail[last - n] = False
    ctx, after, held, kept_after = x[head], x[tail], blocks[head], blocks[tail]
    k = np.full(total, k_eff, dtype=np.int64)
    starts = np.cumsum(n) - n
    offs = starts.tolist()
    corrs: list[list[tuple[int, int, int]]] = []
    for (ks, cum, c0), o in zip(tracks, offs):
        corrs.append(_corrections(ks, cum, c0, k_eff))
        if corrs[-1]:
            k[o : o + len(ks)] = ks
    rej = ctx + k + bs
    rej //= bs
    rej -= kept_after
    kept = kept_after - held
    rows = np.stack((ctx, after - ctx, rej, kept))
    at = np.flatnonzero(kept)  # the growth of every track, split below by track
    grown = kept[at].tolist()
    cut = np.searchsorted(at, starts).tolist() + [len(at)]
    at -= np.repeat(starts, np.diff(cut))
    local = at.tolist()
    return [
        (rows[:, o : o + m], c, local[a:b], grown[a:b])
        for o, m, c, a, b in zip(offs, n.tolist(), corrs, cut, cut[1:])
    ]


def _corrections(ks: list[int], cum: list[int], c0: int, k_eff: int) -> list[tuple[int, int, int]]:
    """``(j, drafts, pairs)`` at the steps whose ``k`` is not ``k_eff`` (the first, the last
    few): the differences from the ``k_eff`` sums."""
    n = len(ks)
    off = [0] if ks[0] != k_eff else []
    j = n - 1
    while j > 0 and ks[j] != k_eff:
        off.append(j)
        j -= 1
    q, out = k_eff + 1, []
    for j in off:
        k, cj = ks[j], c0 + cum[j]
        out.append(
            (j, k - k_eff, (k + 1) * cj + (k + 1) * (k + 2) // 2 - q * cj - q * (q + 1) // 2)
        )
    return out
