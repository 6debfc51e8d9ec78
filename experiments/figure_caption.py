"""The words on a sweep's figures: where the numbers come from, the setting, the runs, the SLO.

A reader must not take a simulated figure for a measured one, nor one goodput for the other, so
every title reads, line by line::

    Simulated (engine-fitted cost model): qwen2.5-7b on H200, 3,000 KV blocks, workload ...,
    3 seeds × 5,000 requests per point
    SLO h200_7b: TTFT ≤ 1 s and every ITL ≤ 50 ms (lifetime goodput)
    <what the figure shows>

The first word comes from the run's summary: ``run.backend`` is ``sim`` for the SimPy twin
(``experiments.run``, with ``run.cost_model`` naming its cost model) and ``engine`` for runs
measured on the GPU and brought back by ``python -m experiments.engine_runs import`` (whose
``cost_model`` is ``measured``).
"""

from __future__ import annotations

import re
import textwrap

import pandas as pd

SIMULATED, ENGINE = "Simulated", "Engine"
TITLE_CHARS = 140  # a title line wider than the figure at its font size is wrapped
_SOURCES = {"sim": SIMULATED, "engine": ENGINE}
_COST_MODELS = {
    "roofline": "roofline cost model",
    "fitted": "profiler-fitted cost model",
    "engine_fitted": "engine-fitted cost model",
}


def source(setting: dict) -> str:
    """``Simulated (<cost model>)`` or ``Engine (measured on the GPU)``, from the setting's
    ``backend`` and ``cost_model``; raises ``ValueError`` for any other backend."""
    backend = setting["backend"]
    if backend not in _SOURCES:
        known = ", ".join(_SOURCES)
        raise ValueError(f"run backend must be one of {known} to be plotted, got {backend!r}")
    if _SOURCES[backend] == ENGINE:
        return f"{ENGINE} (measured on the GPU)"
    cost = setting["cost_model"]
    return f"{SIMULATED} ({_COST_MODELS.get(cost, f'{cost} cost model')})"


def slo_text(setting: dict) -> str:
    """``SLO <name>: TTFT ≤ 1 s and every ITL ≤ 50 ms (lifetime goodput)``."""
    return f"SLO {setting['slo_name']}: {lifetime_slo_text(setting)} (lifetime goodput)"


def lifetime_slo_text(setting: dict) -> str:
    """The SLO as lifetime goodput counts it: the first token and every gap after it."""
    return f"TTFT ≤ {setting['slo_ttft']:g} s and every ITL ≤ {setting['slo_itl'] * 1e3:g} ms"


def tpot_slo_text(setting: dict) -> str:
    """The SLO as TPOT goodput (vLLM's ``--goodput``) counts it: the mean gap, not every gap."""
    return f"TTFT ≤ {setting['slo_ttft']:g} s and mean TPOT ≤ {setting['slo_itl'] * 1e3:g} ms"


def runs_text(rows: pd.DataFrame, num_requests: int) -> str:
    """``3 seeds × 5,000 requests``: the seeds of each (policy, rate) point (a range where the
    points differ) times the requests of each run."""
    per_point = rows.groupby(["policy", "rate"])["seed"].nunique()
    lo, hi = int(per_point.min()), int(per_point.max())
    seeds = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return f"{seeds} seed{'' if hi == 1 else 's'} × {int(num_requests):,} requests"


def caption(setting: dict, rows: pd.DataFrame, what: str) -> str:
    """The title of a figure of ``rows`` (one setting's runs) showing ``what``: three lines, a
    fourth with the options the legend leaves out (``legend_label``), each wrapped to the
    figure's width."""
    where = (
        f"{setting['model']} on {setting['gpu']}, {int(setting['num_blocks']):,} KV blocks, "
        f"workload {setting['workload']}, {runs_text(rows, setting['num_requests'])}"
    )
    shared = shared_options(sorted(rows["policy"].unique()))
    lines = [f"{source(setting)}: {where}", slo_text(setting), what]
    if shared:
        lines.append(f"(options of every {shared})")
    return "\n".join(textwrap.fill(line, TITLE_CHARS) for line in lines)


def _split(label: str) -> tuple[str, str, str]:
    """``name(options)[predictor]`` -> its three parts (each may be empty but the name)."""
    m = re.fullmatch(r"([^(\[]+)(\([^)]*\))?(\[.*\])?", label)
    if m is None:
        return label, "", ""
    return m.group(1), m.group(2) or "", m.group(3) or ""


def _options(opts: str) -> list[str]:
    """``(a=1, b=x)`` -> ``["a=1", "b=x"]`` (split before each ``key=``)."""
    return [o for o in re.split(r",\s*(?=\w+=)", opts[1:-1]) if o] if opts else []


def _common_options(policies: list[str]) -> dict[str, list[str]]:
    """Per policy name run with several labels, the options every one of them has."""
    by_name: dict[str, list[list[str]]] = {}
    for p in policies:
        name, opts, _ = _split(p)
        by_name.setdefault(name, []).append(_options(opts))
    return {
        name: [o for o in runs[0] if all(o in r for r in runs[1:])]
        for name, runs in by_name.items()
        if len(runs) > 1
    }


def legend_label(policy: str, policies: list[str]) -> str:
    """``policy`` without the options every policy of its name among ``policies`` shares (they
    go in the title, ``shared_options``): ``horizon(triage=False)[learned]``."""
    name, opts, pred = _split(policy)
    common = _common_options(policies).get(name, [])
    rest = [o for o in _options(opts) if o not in common]
    return f"{name}({', '.join(rest)}){pred}" if rest else f"{name}{pred}"


def shared_options(policies: list[str]) -> str:
    """The options ``legend_label`` left out, per policy name (``""`` if none)."""
    common = _common_options(policies)
    return "; ".join(f"{n}: {', '.join(o)}" for n, o in sorted(common.items()) if o)
