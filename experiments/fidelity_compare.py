"""The CPU half of ``python -m experiments.fidelity compare``: the engine's saved runs against
the simulator on the same requests, policies and scheduler, metric by metric.

Steps (each a function below, called in turn by ``compare``):
1. **Cost model** (``_fit_cost_model``). The step rows (plan shape, measured period) of the
   manifest's ``calibration`` cases fit ``simulator.engine_cost_model.EngineCostModel``; it is
   written as the committed calibration file. Candidates are scored on the ``fidelity`` cases'
   steps (held out: other runs, other seeds and loads; ``experiments.fidelity_cost_models``).
2. **Simulation** (``_simulate_runs``). Each fidelity case and policy runs on the simulator with
   the online linear model, arrivals queued at step boundaries as the engine does, stopped at
   the case's ``max_time`` as the engine run was.
3. **Errors** (``_headline``). For TTFT, ITL and E2E (mean and p99 over the run's finished
   requests, ITL over all inter-token gaps), the relative error |sim - engine| / engine; for
   lifetime goodput, the absolute difference in percentage points; the worst of each over cases
   and policies. The policy ranking by goodput at each load is identical when every pair of
   policies is ordered alike on both sides (``experiments.fidelity_ranking``).
4. **Scatter and bias** (``_with_noise``, ``_sensitivity``). Every run again with the engine's
   step-time scatter (``NOISE_SEEDS``), and with every step 1% longer and shorter.
5. **Repeat** (``_add_repeat``). A second engine run of the cases, scored like the simulator.

Writes into the report folder ``report.json`` (every figure the page shows, to
``REPORT_DIGITS`` significant digits, and its conditions as set), ``table.csv`` (one row per
run), ``steps_mape.json``, the plots, and the page ``README.md`` rendered from ``report.json``
(``experiments.fidelity_page``; its hand-written notes are kept). Prints as its LAST line one
JSON object, the headline.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from experiments import compact_json
from experiments.fidelity_manifest import Case, Manifest
from experiments.fidelity_ranking import banded, rank_pairs, same_ranking
from horizon.metrics import summarize
from horizon.metrics.records import RunRecords
from horizon.request import SLO
from horizon.workload.requests_file import load_requests

METRICS = ("ttft_mean", "ttft_p99", "itl_mean", "itl_p99", "e2e_mean", "e2e_p99")
NOISE_SEEDS = tuple(range(10))
SENSITIVITY_SCALES = (0.99, 1.01)  # uniform step-time biases of -1% and +1%
STEP_MAPE_TARGET = 0.03  # the bar: held-out step-time MAPE
LATENCY_TARGET = 0.05  # ... relative error of every latency mean and p99
GOODPUT_TARGET_PTS = 2.0  # ... and of lifetime goodput, in percentage points
BAND_SLACK = 0.005  # a goodput within half a point of the simulator's range over noise seeds
REPORT_DIGITS = 8  # report.json's and steps_mape.json's; at 6, figures a half unit from the
# page's rounding flip
REPO = Path(__file__).resolve().parents[1]


def engine_pipelined(engine: dict) -> bool:
    """Whether engine runs with this ``EngineConfig`` (as a dict, from a run's meta.json)
    planned each step while the previous one ran: ``EngineConfig.pipelined``'s rule, read from
    the dict (configs from before ``async_steps`` existed ran serially)."""
    if "async_steps" not in engine:
        return False
    flag = engine["async_steps"]
    return engine.get("stop", "trace") == "trace" if flag is None else bool(flag)


def load_runs(engine_dir: Path, cases: tuple[Case, ...]) -> dict[tuple[str, str], RunRecords]:
    runs = {}
    for c in cases:
        for p in c.policies:
            f = engine_dir / c.name / p / "records.npz"
            if not f.exists():
                raise FileNotFoundError(f"{f}: the engine run of case {c.name}, policy {p}")
            runs[(c.name, p)] = RunRecords.load_npz(str(f))
    return runs


def _engine_model(engine_dir: Path) -> str:
    """The model shape the engine runs under ``engine_dir`` ran (from their meta.json)."""
    metas = sorted(engine_dir.glob("*/*/meta.json"))
    if not metas:
        raise FileNotFoundError(f"{engine_dir}: no engine runs (<case>/<policy>/meta.json)")
    return json.loads(metas[0].read_text())["model"]


def case_meta(engine_dir: Path, case: Case, policy: str | None = None) -> dict:
    """The meta.json of ``case``'s run of ``policy`` (default: its first policy)."""
    p = policy or case.policies[0]
    return json.loads((engine_dir / case.name / p / "meta.json").read_text())


def simulate_engine_loop(
    requests,
    m: Manifest,
    spec,
    cost_model,
    max_time: float | None,
    pipelined: bool,  # noqa: ANN001
) -> RunRecords:
    """The simulator run of ``requests`` as the engine ran them: the manifest's scheduler and
    SLO, the policy ``spec``, arrivals queued between steps, the engine's loop (``pipelined``)
    and its time limit."""
    from simulator.simulation import Simulation

    return Simulation(
        requests,
        m.scheduler_config(),
        spec.build(m.ttft_slo),
        cost_model,
        max_time=max_time,
        arrivals_at_step_boundaries=True,
        pipelined=pipelined,
    ).run()


def in_band(goodput: float, band: tuple[float, float]) -> bool:
    """``goodput`` lies in the simulator's ``(min, max)`` over noise seeds, within
    ``BAND_SLACK``."""
    return band[0] - BAND_SLACK <= goodput <= band[1] + BAND_SLACK


def check_same_requests(rec: RunRecords, requests, case: str) -> None:  # noqa: ANN001
    """That the run ``rec`` served ``requests``: the same ids, each with the same arrival time,
    prompt length and output limit.

    Raises:
        ValueError: they differ (the requests were rebuilt by other code or settings).
    """
    reqs = sorted(requests, key=lambda r: r.request_id)
    want = np.array(
        [(r.request_id, r.arrival_time, r.num_prompt_tokens, r.max_output_tokens) for r in reqs],
        dtype=np.float64,
    ).reshape(-1, 4)
    order = np.argsort(rec.request_id, kind="stable")
    cols = (rec.request_id, rec.arrival_time, rec.num_prompt_tokens, rec.max_output_tokens)
    got = np.stack([np.asarray(c, dtype=np.float64)[order] for c in cols], axis=1)
    if rec.num_requests != len(requests) or not np.array_equal(got, want):
        raise ValueError(
            f"case {case}: the engine run's requests are not the manifest's (re-export with the "
            "same code, or give the manifest the run used)"
        )


def engine_dates(metas: list[dict]) -> dict[str, list[str]]:
    """The dates and commits the engine runs of these meta.json record (sorted, distinct;
    runs from before meta.json named a commit give none)."""
    return {
        "dates": sorted({str(d["date"]) for d in metas if d.get("date")}),
        "commits": sorted({str(d["commit"]) for d in metas if d.get("commit")}),
    }


@dataclass(frozen=True)
class _Setup:
    """What ``compare`` reads before any fit: the manifest, the engine's runs, their meta and
    step rows."""

    m: Manifest
    inputs: Path  # the manifest's folder: the requests files
    runs: dict[tuple[str, str], RunRecords]  # (case, policy) -> records, calibration included
    metas: dict[tuple[str, str], dict]
    keys: tuple[tuple[Case, str], ...]  # the compared runs, in table order
    rows: dict[tuple[str, str], np.ndarray]  # the compared runs' step rows
    # simulated runs so far (a counter: the noise and bias steps add runs as they go)
    progress: tqdm = field(
        default_factory=lambda: tqdm(desc="simulated runs", unit="run", disable=None),
        compare=False,
    )

    @property
    def meta(self) -> dict:
        """The first compared run's meta.json (GPU, software, engine config)."""
        c, p = self.keys[0]
        return self.metas[(c.name, p)]

    @property
    def slo(self) -> SLO:
        return SLO(self.m.ttft_slo, self.m.itl_slo)

    @property
    def pipelined(self) -> bool:
        return engine_pipelined(self.meta.get("engine") or {})

    def buckets(self):  # noqa: ANN201 - simulator.engine_cost_model.Buckets
        from simulator.engine_cost_model import Buckets

        sc = self.m.scheduler_config()
        return Buckets(sc.max_num_seqs, sc.max_num_batched_tokens)

    def simulate(self, c: Case, p: str, cost_model) -> RunRecords:  # noqa: ANN001
        requests = load_requests(self.inputs / c.requests)  # fresh: a run mutates them
        records = simulate_engine_loop(
            requests, self.m, self.m.policies[p], cost_model, c.max_time, self.pipelined
        )
        self.progress.update()
        return records


def _setup(engine_dir: str, manifest_path: str | None) -> _Setup:
    """Load the manifest (rebuilt, seeded, where the default one is absent) and the engine's
    runs of its calibration and fidelity cases; check the compared runs' requests."""
    from experiments.fidelity import export, preset
    from simulator.engine_cost_model import rows_of

    edir = Path(engine_dir)
    model = _engine_model(edir)
    mpath = Path(manifest_path or REPO / preset(model).out / "manifest.json")
    if manifest_path is None and not mpath.exists():  # the requests are rebuilt, seeded
        export(str(mpath.parent), model)
    m = Manifest.load(mpath)
    cases = m.of_role("calibration") + m.of_role("fidelity")
    runs = load_runs(edir, cases)
    keys = tuple((c, p) for c in m.of_role("fidelity") for p in c.policies)
    for c, p in keys:
        check_same_requests(runs[(c.name, p)], load_requests(mpath.parent / c.requests), c.name)
    return _Setup(
        m,
        mpath.parent,
        runs,
        {(c.name, p): case_meta(edir, c, p) for c in cases for p in c.policies},
        keys,
        {(c.name, p): rows_of([runs[(c.name, p)]]) for c, p in keys},
    )


def _fit_cost_model(s: _Setup, calibration_out: str | Path | None) -> tuple[dict, object, Path]:
    """Step 1: fit the candidates to the calibration steps, score them on the compared runs'
    steps, write the online linear model's calibration file. Returns (MAPE by candidate, the
    model as the simulator loads it from that file, the file)."""
    from experiments.fidelity_cost_models import candidates, self_fit_mape
    from simulator.engine_cost_model import EngineCostModel, mape, rows_of, write_steps

    buckets = s.buckets()
    cal = s.m.of_role("calibration")
    cal_rows = rows_of(s.runs[(c.name, p)] for c in cal for p in c.policies)
    fid_rows = np.concatenate(list(s.rows.values()))
    cands = candidates(s.m.model, cal_rows, buckets)
    step_mape = {name: mape(model, fid_rows) for name, model in cands.items()}
    step_mape["linear, each run fitted to itself"] = self_fit_mape(list(s.rows.values()), buckets)
    meta = s.meta
    cal_meta = {
        "gpu": meta["gpu"],
        "model": s.m.model,
        "torch": meta.get("torch"),
        "triton": meta.get("triton"),
        "date": meta.get("date"),
        "engine": meta.get("engine"),
        "runs": [f"{c.name}/{p}" for c in cal for p in c.policies],
        "buckets": {"max_num_seqs": buckets.max_num_seqs,
                    "max_num_batched_tokens": buckets.max_num_batched_tokens},
        "step_s": "each step's own time in the engine's online loop (records' "
        "step_durations: from the later of its planning and the previous step's end to its end)",
        "knee_tokens": cands["linear, online steps"].knee,  # chosen by the fit; read back
    }  # fmt: skip
    cal_file = Path(calibration_out or REPO / "calibration" / f"h200_{s.m.model}_online.csv.gz")
    write_steps(cal_rows, cal_file, cal_meta)
    return step_mape, EngineCostModel.from_file(cal_file), cal_file


def _simulate_runs(s: _Setup, model) -> tuple[list[dict], dict]:  # noqa: ANN001
    """Step 2: simulate every compared run with ``model``. Returns (one row per run: each
    metric on both sides, its errors, the model's bias on the run's steps and the steps
    before a refresh; each run's engine summary by (case, policy))."""
    from experiments.fidelity_cost_models import pre_refresh

    engine = {(c.name, p): summarize(s.runs[(c.name, p)], slo=s.slo) for c, p in s.keys}
    table = []
    for c, p in s.keys:
        sim = s.simulate(c, p, model)
        e, sm = engine[(c.name, p)], summarize(sim, slo=s.slo)
        row = {"case": c.name, "workload": c.workload, "rate": c.rate, "policy": p}
        for k in ("goodput_lifetime", "preemptions", "finished", *METRICS):
            row[f"{k}_engine"], row[f"{k}_sim"] = e[k], sm[k]
        row.update({_err_key(k): v for k, v in _errors(sm, e).items()})
        rows = s.rows[(c.name, p)]
        modelled = model.predict_rows(rows)
        row["model_bias"] = float(modelled.sum() / rows[:, -1].sum() - 1)
        row["steps_engine"], row["steps_sim"] = len(rows), len(sim.step_end)
        refreshed = s.runs[(c.name, p)].num_refreshed
        shadow = pre_refresh(refreshed, rows, modelled) or (None, None, None)
        row["pre_refresh_ratio"], row["decode_ratio"], row["pre_refresh_steps"] = shadow
        table.append(row)
        print(
            f"{c.name:12s} {p:13s} goodput {e['goodput_lifetime']:.3f}/"
            f"{sm['goodput_lifetime']:.3f}  ttft p99 {e['ttft_p99']:.4f}/{sm['ttft_p99']:.4f}"
            f"  itl p99 {1e3 * e['itl_p99']:.2f}/{1e3 * sm['itl_p99']:.2f} ms",
            flush=True,
        )
    return table, engine


def _rankings(fid: tuple[Case, ...], table: list[dict]) -> dict:
    """Step 3a: per fidelity case, each side's ranking of its policies by goodput and whether
    they agree (both readings)."""
    ranking = {}
    for c in fid:
        rows = [r for r in table if r["case"] == c.name]
        pe = rank_pairs({r["policy"]: r["goodput_lifetime_engine"] for r in rows})
        ps = rank_pairs({r["policy"]: r["goodput_lifetime_sim"] for r in rows})
        ranking[c.name] = {
            "identical": same_ranking(pe, ps),
            "band_per_side": banded(pe) == banded(ps),  # the stricter reading
            "engine": pe,
            "sim": ps,
        }
    return ranking


def _headline(step_mape: dict, table: list[dict], ranking: dict) -> dict:
    """Step 3b: the worst of each error over the compared runs, and the rankings' agreement."""
    worst = {f"{k}_err": max(r[f"{k}_err"] for r in table) for k in METRICS}
    return {
        "step_mape": step_mape["linear, online steps"]["all"] / 100,
        **worst,
        "goodput_err_pts": max(r["goodput_err_pts"] for r in table),
        "ranking_identical": all(v["identical"] for v in ranking.values()),
        "ranking_identical_band_per_side": all(v["band_per_side"] for v in ranking.values()),
    }


def _with_noise(s: _Setup, model, table: list[dict], engine: dict, result: dict) -> list:  # noqa: ANN001
    """Step 4a: every run simulated again with the engine's step-time scatter, per noise seed.
    Sets each row's ``goodput_sim_band`` (min, max over seeds) and the headline's in-band count
    and median worst errors; returns per seed the runs' errors (and simulated goodput)."""
    noisy = []
    for seed in NOISE_SEEDS:
        errs = []
        for c, p in s.keys:
            sm = summarize(s.simulate(c, p, model.with_noise(seed)), slo=s.slo)
            errs.append(_errors(sm, engine[(c.name, p)]) | {"goodput": sm["goodput_lifetime"]})
        noisy.append(errs)
    for i, r in enumerate(table):  # the simulator's spread over seeds, per run
        g = [errs[i]["goodput"] for errs in noisy]
        r["goodput_sim_band"] = (min(g), max(g))
    inside = [in_band(r["goodput_lifetime_engine"], r["goodput_sim_band"]) for r in table]
    result["engine_goodput_in_sim_band"] = f"{sum(inside)}/{len(inside)}"
    result["with_step_noise"] = {
        _err_key(k): float(np.median([max(r[k] for r in errs) for errs in noisy]))
        for k in (*METRICS, "goodput_err_pts")
    }
    return noisy


def _sensitivity(s: _Setup, model, table: list[dict], result: dict) -> None:  # noqa: ANN001
    """Step 4b: how far a uniform 1% step-time bias alone moves each simulated metric (the
    model's held-out error is a few percent, so a metric that moves more than its target is
    beyond any model). Sets each row's ``<metric>_moved_1pct`` and the headline's worst."""
    for (c, p), r in zip(s.keys, table):
        det = {k: r[f"{k}_sim"] for k in ("goodput_lifetime", *METRICS)}
        moved = [
            _errors(summarize(s.simulate(c, p, model.scaled(f)), slo=s.slo), det)
            for f in SENSITIVITY_SCALES
        ]
        for k in (*METRICS, "goodput_err_pts"):  # flat columns, for table.csv
            r[f"{k}_moved_1pct"] = max(e[k] for e in moved)
    result["one_percent_sensitivity"] = {
        _err_key(k): max(r[f"{k}_moved_1pct"] for r in table) for k in (*METRICS, "goodput_err_pts")
    }


def _repeat_rows(rdir: Path, table: list[dict], slo: SLO) -> list[dict]:
    """The engine's second runs against its first (and the simulator), per case and policy."""
    out = []
    for r in table:
        f = rdir / r["case"] / r["policy"] / "records.npz"
        if not f.exists():
            continue
        s = summarize(RunRecords.load_npz(str(f)), slo=slo)
        row = {"case": r["case"], "policy": r["policy"]}
        for k in ("goodput_lifetime", "ttft_p99", "itl_p99", "e2e_mean", "preemptions"):
            row[k] = (r[f"{k}_engine"], s[k], r[f"{k}_sim"])
        row["goodput_diff_pts"] = 100 * abs(s["goodput_lifetime"] - r["goodput_lifetime_engine"])
        # the second run scored like the simulator: relative to the first run
        row["errors"] = {k: _rel(s[k], r[f"{k}_engine"]) for k in METRICS}
        lo, hi = r["goodput_sim_band"]
        row["band"] = (lo, hi)
        row["in_band"] = in_band(s["goodput_lifetime"], (lo, hi))
        out.append(row)
    return out


def _add_repeat(result: dict, ranking: dict, table: list[dict], repeat: list[dict]) -> None:
    """Step 5: the second engine runs' figures into the headline, and each case's ranking by
    the second runs where every policy ran again (``engine_again``)."""
    result["engine_repeat_in_sim_band"] = f"{sum(r['in_band'] for r in repeat)}/{len(repeat)}"
    result["engine_repeat_goodput_diff_pts"] = max(r["goodput_diff_pts"] for r in repeat)
    result["engine_repeat_errors"] = {
        f"{k}_err": max(r["errors"][k] for r in repeat) for k in METRICS
    }
    again = {(r["case"], r["policy"]): r["goodput_lifetime"][1] for r in repeat}
    for name, v in ranking.items():
        g = {p: again[(name, p)] for (c, p) in again if c == name}
        if g and len(g) == sum(r["case"] == name for r in table):  # every policy again
            v["engine_again"] = rank_pairs(g)
    both = [v for v in ranking.values() if "engine_again" in v]
    if both:
        result["engine_repeat_ranking_identical"] = all(
            same_ranking(v["engine"], v["engine_again"]) for v in both
        )
        result["ranking_identical_vs_repeat"] = all(
            same_ranking(v["sim"], v["engine_again"]) for v in both
        )


def _errors(sim: dict, eng: dict) -> dict[str, float]:
    """Relative error of each latency metric, and the goodput gap in percentage points."""
    out = {k: _rel(sim[k], eng[k]) for k in METRICS}
    out["goodput_err_pts"] = 100 * abs(sim["goodput_lifetime"] - eng["goodput_lifetime"])
    return out


def _err_key(k: str) -> str:
    """The result key of an ``_errors`` entry: ``<metric>_err``, and ``goodput_err_pts`` as is."""
    return k if k == "goodput_err_pts" else f"{k}_err"


def _rel(sim: float, eng: float) -> float:
    if not (math.isfinite(sim) and math.isfinite(eng)) or eng == 0:
        return math.nan
    return abs(sim - eng) / abs(eng)


def compare(
    engine_dir: str,
    manifest_path: str | None,
    report: str,
    calibration_out: str | Path | None = None,
    repeat_dir: str | None = None,
) -> dict:
    """See the module docstring. ``calibration_out``: where the fitted calibration file goes
    (default ``calibration/h200_<model>_online.csv.gz``). ``repeat_dir``: a second engine run
    of some of the fidelity cases (same layout): the report then compares the engine with
    itself, the floor of any simulator-vs-engine comparison. Returns the headline dict (the
    printed last line; ``report.json``'s ``headline``, there to ``REPORT_DIGITS`` digits).

    Raises:
        FileNotFoundError: an engine run the manifest names is missing.
        ValueError: an engine run's requests are not the manifest's.
    """
    s = _setup(engine_dir, manifest_path)
    step_mape, model, cal_file = _fit_cost_model(s, calibration_out)
    table, engine = _simulate_runs(s, model)
    ranking = _rankings(s.m.of_role("fidelity"), table)
    result = _headline(step_mape, table, ranking)
    noisy = _with_noise(s, model, table, engine, result)
    _sensitivity(s, model, table, result)
    repeat = _repeat_rows(Path(repeat_dir), table, s.slo) if repeat_dir else []
    if repeat:
        _add_repeat(result, ranking, table, repeat)
    out = Path(report)
    out.mkdir(parents=True, exist_ok=True)
    _write_table(table, out / "table.csv")
    text = compact_json.dumps(step_mape, REPORT_DIGITS, sort_keys=False)
    (out / "steps_mape.json").write_text(text)
    from experiments.fidelity_report import document

    doc = document(
        s, step_mape=step_mape, model=model, cal_file=cal_file, table=table, ranking=ranking,
        result=result, repeat=repeat, noisy=noisy,
        dirs={"engine": engine_dir, "repeat": repeat_dir, "report": _repo_path(out)},
    )  # fmt: skip
    text = compact_json.dumps(doc, REPORT_DIGITS, sort_keys=False, exact=("conditions",))
    (out / "report.json").write_text(text)
    _render(out)
    print(json.dumps(result))
    return result


def _render(out: Path) -> None:
    """The plots and the page, from ``report.json`` as written."""
    from experiments.fidelity_page import write_page
    from experiments.fidelity_plots import write_plots

    doc = json.loads((out / "report.json").read_text())
    write_plots(doc, out)
    write_page(doc, out / "README.md")


def _write_table(table: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        for r in table:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def _repo_path(p: Path) -> str:
    """``p`` relative to the repository where it lies inside it."""
    q = p.resolve()
    return str(q.relative_to(REPO)) if q.is_relative_to(REPO) else str(p)
