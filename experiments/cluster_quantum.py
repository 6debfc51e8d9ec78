"""Variant (e) of the cluster comparison: the model of one replica alone on the GPU, every
replica's steps taking round-robin turns on one simulated GPU (``simulator.quantum_device``,
``DeviceSpec(sharing="quantum")``), the time slice chosen held out.

Nothing is fitted to the co-located steps but the time slice. Every case is simulated at each
slice of ``QUANTA_MS`` (no switch cost: the time-slice fit of variant (c) found none); a case
is then judged at the slice that does best on the cases at the *other two* loads of the grid
(most cases within max(2 pts, noise), then the smallest mean error), as variant (d) is judged
by the fit without its load. The grid's own summary per slice is kept beside it: how much the
choice matters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

QUANTA_MS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
SIDE = "sim_quantum"


def quantum_device(quantum_ms: float):  # noqa: ANN201 - DeviceSpec
    from simulator.device_sharing import DeviceSpec

    return DeviceSpec("gpu0", "quantum", quantum_s=quantum_ms * 1e-3)


def slice_grid(
    keys: Sequence,
    simulate: Callable,
    figures: Callable,
    quanta: Sequence[float] = QUANTA_MS,
) -> dict[float, list[dict]]:
    """Each case's figures at each time slice: ``simulate(key, device) -> ClusterRecords``,
    ``figures(records) -> dict``."""
    return {q: [figures(simulate(k, quantum_device(q))) for k in keys] for q in quanta}


def choose_slices(
    rows: list[dict], grid: dict[float, list[dict]], fold_of: Callable, summarize: Callable
) -> dict[int, float]:
    """Per fold (``fold_of(row)``: the case's load index), the slice whose figures do best on
    the rows of the other folds (``summarize(rows, side)``: ``cases_within_band`` and
    ``mean_abs_error_pts``); ties go to the smaller slice."""

    def score(q: float, fold: int) -> tuple:
        held = [r | {SIDE: g} for r, g in zip(rows, grid[q]) if fold_of(r) != fold]
        s = summarize(held, SIDE)
        return (-s["cases_within_band"], s["mean_abs_error_pts"], q)

    folds = sorted({fold_of(r) for r in rows})
    return {f: min(grid, key=lambda q: score(q, f)) for f in folds}


def grid_summary(rows: list[dict], grid: dict[float, list[dict]], summarize: Callable) -> list:
    """Per slice, every case judged at it (in sample: no slice chosen)."""
    out = []
    for q, figs in grid.items():
        s = summarize([r | {SIDE: g} for r, g in zip(rows, figs)], SIDE)
        ranks = s["rankings"]
        out.append(
            {
                "quantum_ms": q,
                "cases_within_band": s["cases_within_band"],
                "mean_abs_error_pts": s["mean_abs_error_pts"],
                "max_abs_error_pts": s["max_abs_error_pts"],
                "order_agrees": sum(k["agrees_up_to_ties"] for k in ranks),
                "loads": len(ranks),
            }
        )
    return out
