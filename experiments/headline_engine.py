"""The headline on the engine: ``experiments.policy_gain``'s policies at its load, run online on
the GPU engine and on the simulator from the same requests, side by side.

    python -m experiments.headline_engine export [--rate R] [--seeds 0 1 2] [--out DIR]
        [--policies P ...]     # CPU
    python -m experiments.engine_replay \
        --manifest gpu_inputs/headline_qwen2.5-7b/seed0/manifest.json \
        --out ENG/seed0        # GPU, one call per seed (~5 min); copy seed0/'s manifest and
                               # *.predictions.sha256 beside its records (compare rebuilds
                               # the predictions and checks them against that digest)
    python -m experiments.headline_engine compare [ENG] [--out results/headline_engine]   # CPU
        [--cost-scale F] [--noise-seeds N]

``export`` builds the headline's setting (``gain_settings.SETTINGS["poisson"]``: the 7B shape,
3,000 blocks, held-out ShareGPT first turns, SLO ``h200_7b``) at ``--rate`` (default: the
previous headline's load, ``results/policy_gain_fcfs_load/policy_gain.json``), and per seed
writes the requests, a manifest
(scheduler, SLO and each policy's options as the simulator's configs resolve them; the engine's
calibrated ``max_model_len``) and the learned predictor's predictions for those requests
(``predictors.prepared``: the engine machine need not have the tokenizer or this scikit-learn,
and both sides replay the same predictions). ``--policies`` exports a subset: e.g. each policy
alone at its own ``rate_at_90`` (``results/headline_engine/rate90``), to see whether the
simulator's 90% points hold on the engine.

``compare`` (default ``ENG``: ``results/headline_engine/engine``, the committed runs) rebuilds
each seed's requests, checks them against the engine's, and simulates every policy with the
cost model fitted to the engine's online steps (``calibration/h200_<shape>_online.csv.gz``),
the engine's loop (a step planned while the previous one runs, arrivals queued between steps)
and the run's time limit. It reports each metric on both sides, per seed and as means, and the
policy gains (horizon + learned over fcfs, sjf_prompt and horizon + oracle) as each side
measures them, into ``headline_engine.json`` and the page rendered from it
(``headline_engine.md``, whose hand-written notes are kept); its LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from experiments import compact_json
from experiments.fidelity_manifest import Case, Manifest, PolicySpec, source_commit

REPO = Path(__file__).resolve().parents[1]
OUT = "gpu_inputs/headline_qwen2.5-7b"  # export: one seed<s>/ folder per seed
ENGINE = "results/headline_engine/engine"  # compare: the engine's runs, one seed<s>/ per seed
SIDES = ("engine", "sim")
# (name in the manifest, the policy_gain row it is, the predictor the engine gets)
POLICIES = (
    ("fcfs", "fcfs", None),
    ("sjf_prompt", "sjf_prompt", None),
    ("horizon_learned", "horizon_learned", "prepared"),
    ("horizon_oracle", "horizon_oracle", "oracle"),
    # the rebuilt headline's tuned rows (configs/policy/tuned/), each run at its own rate_at_90
    ("horizon_tuned", "horizon_tuned", "prepared"),
    ("sglang_tuned", "sglang_tuned", None),
    ("sjf_prompt_tuned", "sjf_prompt_tuned", None),
)
TUNED_ROWS = {
    "horizon_tuned": ["policy=tuned/horizon"],
    "sglang_tuned": ["policy=tuned/sglang"],
    "sjf_prompt_tuned": ["policy=tuned/sjf_prompt"],
}
DRAIN_S = 30.0  # both sides stop this long after the last arrival
# the engine's max_model_len in its calibration runs (experiments.fidelity): the decode kernel's
# split count follows it, so the engine runs the headline with it too (every request fits)
MAX_MODEL_LEN = 4096
METRICS = (
    "goodput_lifetime",
    "throughput_tok_s",
    "ttft_mean",
    "ttft_p99",
    "itl_mean",
    "itl_p99",
    "e2e_mean",
    "recompute_waste",
    "preemptions",
    "queue_wait_max",
    "finished",
)


def _headline_load() -> float:
    path = REPO / "results" / "policy_gain_fcfs_load" / "policy_gain.json"
    if not path.exists():
        raise ValueError(f"{path} is missing: give --rate")
    return float(json.loads(path.read_text())["load"])


def _setting(rate: float, seed: int) -> dict:
    """The run config of each policy_gain row of POLICIES at ``rate``, ``seed``."""
    from hydra import initialize_config_dir

    from experiments.config_store import register_configs
    from experiments.gain_runner import Plan, Runner
    from experiments.gain_settings import SHIPPED_ROWS

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        runner = Runner(Plan(4000, (seed,), 0, rate, rate), [], {**SHIPPED_ROWS, **TUNED_ROWS})
        return {row: runner.config(row, rate, seed) for _, row, _ in POLICIES}


def _requests(rate: float, seed: int, sources=None) -> list:  # noqa: ANN001
    """The headline's requests at ``rate`` for ``seed`` (seeded: the same on every machine)."""
    from experiments.workloads import DataSources, make_workload

    cfg = _setting(rate, seed)["fcfs"]
    requests = make_workload(cfg, sources or DataSources(cfg.data)).new_requests()
    too_long = [r for r in requests if r.num_prompt_tokens + r.max_output_tokens > MAX_MODEL_LEN]
    if too_long:
        raise ValueError(f"{len(too_long)} requests exceed the engine's {MAX_MODEL_LEN} tokens")
    return requests


def export(
    rate: float | None = None,
    seeds: tuple[int, ...] = (0, 1, 2),
    out: str = OUT,
    policies: tuple[str, ...] | None = None,
) -> None:
    """Per seed, write the requests, the learned predictor's predictions and the manifest under
    ``out/seed<s>/``. ``policies``: a subset of ``POLICIES``' names (None: all), e.g. one
    policy at its own ``rate_at_90``.

    Raises:
        ValueError: an unknown or repeated policy name.
    """
    names = [name for name, _, _ in POLICIES]
    chosen = names if policies is None else list(policies)
    unknown = sorted(set(chosen) - set(names))
    if unknown or not chosen or len(set(chosen)) != len(chosen):
        raise ValueError(f"policies must be distinct names among {names}, got {chosen}")
    rate = _headline_load() if rate is None else float(rate)
    sources = None
    for seed in seeds:
        sources = _export_seed(rate, seed, chosen, Path(out) / f"seed{seed}", sources)


def _export_seed(rate: float, seed: int, chosen: list[str], outdir: Path, sources):  # noqa: ANN001, ANN202
    """One seed of ``export`` into ``outdir``; returns the data sources (loaded by the first
    seed, reused by the next)."""
    from experiments.workloads import DataSources
    from horizon.workload.requests_file import save_requests

    cfgs = _setting(rate, seed)
    cfg = cfgs["fcfs"]
    sources = sources or DataSources(cfg.data)
    requests = _requests(rate, seed, sources)
    outdir.mkdir(parents=True, exist_ok=True)
    save_requests(requests, outdir / "headline.json.gz")
    specs = {}
    for name, row, predictor in POLICIES:
        if name not in chosen:
            continue
        c = cfgs[row]
        pred_options = {}
        if predictor == "prepared":
            path = outdir / f"{name}.predictions"
            _save_predictions(c, sources, requests, path)
            pred_options = {"path": _repo_relative(path)}
        specs[name] = PolicySpec(c.policy.name, dict(c.policy.options), predictor, pred_options)
    sc = cfg.scheduler.scheduler_config(cfg.model.num_blocks, cfg.backend.step_mode)
    sc = dataclasses.replace(sc, max_model_len=min(sc.max_model_len, MAX_MODEL_LEN))
    last = max(r.arrival_time for r in requests)
    case = Case("headline", "headline", cfg.workload.name, rate, seed, "headline.json.gz",
                tuple(specs), last + DRAIN_S)  # fmt: skip
    Manifest(
        model=cfg.model.shape,
        scheduler=dataclasses.asdict(sc),
        ttft_slo=cfg.slo.ttft,
        itl_slo=cfg.slo.itl,
        policies=specs,
        cases=(case,),
        notes={
            "slo_preset": cfg.slo.name,
            "drain_s": DRAIN_S,
            "setting": "experiments.gain_settings.SETTINGS['poisson']",
            "num_requests": len(requests),
            "commit": source_commit(),
        },
    ).save(outdir / "manifest.json")
    print(f"seed {seed}: {len(requests)} requests at {rate:g} req/s over {last:.1f} s "
          f"-> {outdir}")  # fmt: skip
    return sources


def _save_predictions(cfg, sources, requests: list, path: Path) -> None:  # noqa: ANN001
    """The learned predictor's memo for ``requests`` (``predictors.prepared``), as ``cfg``'s
    policy builds it; seeded data and training, so the same file on every machine. Beside it,
    ``<path>.sha256``: the predictions' digest (``PreparedPredictor.digest``), kept with the
    engine's records so that a rebuilt file can be checked against what the engine replayed."""
    from predictors.prepared import PreparedPredictor

    learned = sources.predictor(cfg.policy.predictor_config, cfg.workload)
    learned.save_prepared(requests, path)
    _digest_file(path).write_text(PreparedPredictor(path).digest() + "\n")


def _digest_file(predictions: Path) -> Path:
    return predictions.with_name(predictions.name + ".sha256")


def _predictions(
    sdir: Path, policy: str, rate: float, seed: int, requests: list, tmp: Path
) -> Path:
    """The predictions a seed's engine run replayed: the file beside its records, or, where
    that was not kept (a run committed without it), the same file rebuilt under ``tmp``. Either
    is checked against the digest kept beside the records (``<policy>.predictions.sha256``).

    Raises:
        ValueError: neither the file nor its digest was kept, or the file's predictions differ
            from those the engine replayed (the predictor, its data or its code changed since).
    """
    from predictors.prepared import PreparedPredictor

    kept, digest = sdir / f"{policy}.predictions", _digest_file(sdir / f"{policy}.predictions")
    path = kept
    if not kept.exists():
        if not digest.exists():
            raise ValueError(
                f"{sdir}: neither {kept.name} nor its digest {digest.name}: the predictions "
                "the engine replayed cannot be rebuilt and checked"
            )
        path = tmp / f"seed{seed}_{policy}.predictions"
        _rebuild_predictions(policy, rate, seed, requests, path)
        print(f"{sdir.name}: rebuilt {kept.name} (not kept beside the records)", flush=True)
    if digest.exists():
        want, got = digest.read_text().strip(), PreparedPredictor(path).digest()
        if got != want:
            raise ValueError(
                f"{sdir}: the predictions {'rebuilt' if path != kept else 'kept'} for {policy} "
                f"(digest {got[:12]}) are not those the engine replayed ({want[:12]}): the "
                "learned predictor, its data or its code changed since the export"
            )
    return path


def _rebuild_predictions(policy: str, rate: float, seed: int, requests: list, path: Path) -> None:
    """What ``export`` wrote for ``policy`` at ``rate``, ``seed``: seeded data and training give
    the same bytes on every machine (the learned predictor is trained on first use, ~3 min)."""
    from experiments.workloads import DataSources

    (row,) = [row for name, row, _ in POLICIES if name == policy]
    cfg = _setting(rate, seed)[row]
    _save_predictions(cfg, DataSources(cfg.data), requests, path)


def _repo_relative(p: Path) -> str:
    p = p.resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def compare(
    engine_root: str = ENGINE,
    out: str | None = None,
    cost_scale: float = 1.0,
    noise_seeds: int = 0,
) -> dict:
    """Simulate each seed's policies and set them beside the engine's runs (module docstring).

    ``engine_root`` holds one folder per seed (``seed<s>/``: the manifest the engine ran, the
    predictions it replayed, and ``headline/<policy>/`` records); the requests are rebuilt
    (seeded) and checked against the engine's, and so are predictions not kept beside the
    records (``_predictions``). ``cost_scale`` multiplies every modelled step
    time (``EngineCostModel.scaled``): how far the simulated figures move for a given bias.
    ``noise_seeds``: each run is also simulated with the engine's measured step-time scatter
    (``EngineCostModel.with_noise``, seeds ``0..noise_seeds-1``), and the simulated goodput's
    range over those seeds is set beside the engine's: whether a run's figure is one the
    simulator's own spread reaches.

    Writes ``headline_engine.json`` (the returned dict) and the page ``headline_engine.md``
    rendered from it (``experiments.headline_page``) into ``out`` (default
    ``results/headline_engine``).

    Raises:
        ValueError: ``noise_seeds`` with a ``cost_scale`` other than 1 (the scatter is that of
            the fitted model's own steps), or below 0.
    """
    if noise_seeds < 0 or (noise_seeds and cost_scale != 1.0):
        raise ValueError(
            f"noise_seeds must be >= 0 and needs cost_scale 1 (got {noise_seeds}, {cost_scale})"
        )
    seed_dirs = sorted(Path(engine_root).glob("seed*"), key=lambda d: int(d.name[4:]))
    if not seed_dirs:
        raise FileNotFoundError(f"{engine_root}: no seed<s>/ folders of engine runs")
    per_seed, m = _compare_seeds(seed_dirs, cost_scale, noise_seeds)
    where = Path(out or REPO / "results" / "headline_engine")
    result = _result(per_seed, m, seed_dirs[-1], cost_scale, noise_seeds)
    result |= _conditions(m, seed_dirs, Path(engine_root), where)
    _write(result, where)
    print(json.dumps({k: result[k] for k in ("rate", "seeds", "gain", "goodput_err_pts")}))
    return result


def _compare_seeds(
    seed_dirs: list[Path], cost_scale: float, noise_seeds: int
) -> tuple[dict[int, dict], Manifest]:
    """Each seed's runs beside the simulator's (``_compare_seed``), by seed; and the last
    seed's manifest.

    Raises:
        ValueError: a seed's setting differs from the first seed's.
    """
    per_seed: dict[int, dict] = {}
    m: Manifest | None = None
    cost = None  # the setting, hence the model, is the same for every seed: loaded once
    tmp = Path(tempfile.mkdtemp(prefix="headline_engine_"))
    try:
        for sdir in seed_dirs:
            first, m = m, Manifest.load(sdir / "manifest.json")
            if first is not None and _setting_of(first) != _setting_of(m):
                raise ValueError(
                    f"{sdir}: another setting than {seed_dirs[0]} (model, load, scheduler, SLO "
                    "and policies must match across seeds)"
                )
            if cost is None:
                cost = _cost_model(m.model, cost_scale)
            (case,) = m.of_role("headline")
            per_seed[case.seed] = _compare_seed(sdir, m, cost, tmp, noise_seeds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert m is not None
    return per_seed, m


def _result(
    per_seed: dict[int, dict], m: Manifest, last_dir: Path, cost_scale: float, noise_seeds: int
) -> dict:
    """The comparison's figures: per seed, means and spreads over seeds, gains, the worst
    goodput gap; with the setting and the engine's GPU and software (``last_dir``'s runs)."""
    from experiments.fidelity_compare import case_meta

    (case,) = m.of_role("headline")
    meta = case_meta(last_dir, case)
    mean = _means(per_seed)
    return {
        "rate": case.rate,
        "seeds": sorted(per_seed),
        "num_requests": m.notes.get("num_requests"),
        "max_time_s": case.max_time,
        "model": m.model,
        "gpu": meta.get("gpu"),
        "date": meta.get("date"),
        "torch": meta.get("torch"),
        "triton": meta.get("triton"),
        "cost_model": _calibration(m.model),
        "cost_scale": cost_scale,
        "noise_seeds": noise_seeds,
        "engine_in_noise_band": _in_band(per_seed) if noise_seeds else None,
        "mean": mean,
        "goodput_spread": _spread(per_seed),
        "per_seed": per_seed,
        **_gains(mean),
        "goodput_err_pts": {
            "mean": _worst_gap(mean.values()),
            "per_seed": _worst_gap(r for rows in per_seed.values() for r in rows.values()),
        },
    }


def _means(per_seed: dict[int, dict]) -> dict:
    """Policy -> metric -> side -> the mean over seeds."""
    policies = list(next(iter(per_seed.values())))
    return {
        p: {
            k: {side: float(np.mean([per_seed[s][p][k][side] for s in per_seed])) for side in SIDES}
            for k in METRICS
        }
        for p in policies
    }


def _spread(per_seed: dict[int, dict]) -> dict:
    """Policy -> side -> [min, max] of the goodput over seeds."""
    policies = list(next(iter(per_seed.values())))
    return {
        p: {
            side: [
                min(per_seed[s][p]["goodput_lifetime"][side] for s in per_seed),
                max(per_seed[s][p]["goodput_lifetime"][side] for s in per_seed),
            ]
            for side in SIDES
        }
        for p in policies
    }


def _gains(mean: dict) -> dict:
    """``gain``: horizon + learned's mean goodput over each other policy's, per side, for the
    pairs whose two policies ran (an export may hold a subset); ``throughput_vs_fcfs``: the
    same of throughput over fcfs's (None without both)."""

    def gain(a: str, b: str, metric: str, side: str) -> float | None:
        den = mean[b][metric][side]
        return round(mean[a][metric][side] / den, 3) if den else None

    pairs = [
        ("horizon_learned", b)
        for b in ("fcfs", "sjf_prompt", "horizon_oracle")
        if "horizon_learned" in mean and b in mean
    ]
    both = {"horizon_learned", "fcfs"} <= set(mean)
    return {
        "gain": {
            f"{a}_vs_{b}": {side: gain(a, b, "goodput_lifetime", side) for side in SIDES}
            for a, b in pairs
        },
        "throughput_vs_fcfs": {
            side: gain("horizon_learned", "fcfs", "throughput_tok_s", side) for side in SIDES
        }
        if both
        else None,
    }


def _worst_gap(rows) -> float:  # noqa: ANN001 - an iterable of {metric: {side: value}}
    """The largest engine-simulator goodput gap of ``rows``, in points (2 decimals)."""
    gaps = [abs(r["goodput_lifetime"]["engine"] - r["goodput_lifetime"]["sim"]) for r in rows]
    return round(100 * max(gaps), 2)


def _conditions(m: Manifest, seed_dirs: list[Path], engine_root: Path, where: Path) -> dict:
    """What the page names beside the figures: workload, SLO, scheduler, the engine runs'
    folder, dates and commits, and the report's folder."""
    from experiments.fidelity_compare import engine_dates

    (case,) = m.of_role("headline")
    metas = [
        json.loads(f.read_text())
        for d in seed_dirs
        for f in sorted((d / case.name).glob("*/meta.json"))
    ]
    return {
        "workload": case.workload,
        "slo": {
            "ttft_s": m.ttft_slo,
            "itl_s": m.itl_slo,
            "preset": m.notes.get("slo_preset"),
            "goodput": "lifetime",
        },
        "scheduler": m.scheduler,
        "drain_s": m.notes.get("drain_s"),
        "engine": {"dir": _repo_relative(engine_root), **engine_dates(metas)},
        "report_dir": _repo_relative(where),
    }


def _in_band(per_seed: dict) -> str:
    """How many runs' engine goodput lies within the simulator's range over noise seeds (as the
    fidelity experiment counts it: ``fidelity_compare.in_band``)."""
    from experiments.fidelity_compare import in_band

    inside = [
        in_band(r["goodput_lifetime"]["engine"], r["goodput_noise_band"])
        for rows in per_seed.values()
        for r in rows.values()
    ]
    return f"{sum(inside)}/{len(inside)}"


def _cost_model(model: str, cost_scale: float):  # noqa: ANN202
    from simulator.engine_cost_model import EngineCostModel

    cost = EngineCostModel.from_file(REPO / _calibration(model))
    return cost if cost_scale == 1.0 else cost.scaled(cost_scale)


def _compare_seed(  # noqa: ANN001 - cost: a step cost model
    sdir: Path, m: Manifest, cost, tmp: Path, noise_seeds: int = 0
) -> dict:
    """Each policy of one seed's engine runs beside the simulator's run of it: ``{policy:
    {metric: {"engine", "sim"}, "steps": the cost model's error on the run's steps,
    "goodput_noise_band": [min, max] over ``noise_seeds`` noisy simulations (None without)}}``.
    """
    from experiments.fidelity_compare import (
        case_meta,
        check_same_requests,
        engine_pipelined,
        load_runs,
        simulate_engine_loop,
    )
    from horizon.metrics import summarize
    from horizon.request import SLO
    from simulator.engine_cost_model import mape, rows_of

    (case,) = m.of_role("headline")
    runs = load_runs(sdir, (case,))
    slo = SLO(m.ttft_slo, m.itl_slo)
    pipelined = engine_pipelined(case_meta(sdir, case).get("engine") or {})
    rows = {}
    built = _requests(case.rate, case.seed)
    for p in case.policies:
        requests = copy.deepcopy(built)  # a run mutates its requests
        check_same_requests(runs[(case.name, p)], requests, f"{sdir.name}/{case.name}")
        spec = m.policies[p]
        if spec.predictor == "prepared":  # the predictions the engine replayed
            path = _predictions(sdir, p, case.rate, case.seed, built, tmp)
            spec = dataclasses.replace(spec, predictor_options={"path": str(path)})
        sim = simulate_engine_loop(requests, m, spec, cost, case.max_time, pipelined)
        e, s = summarize(runs[(case.name, p)], slo=slo), summarize(sim, slo=slo)
        rows[p] = {k: {"engine": float(e[k]), "sim": float(s[k])} for k in METRICS}
        rows[p]["steps"] = _step_error(cost, rows_of([runs[(case.name, p)]]), mape)
        band = [
            summarize(
                simulate_engine_loop(
                    copy.deepcopy(built), m, spec, cost.with_noise(k), case.max_time, pipelined
                ),
                slo=slo,
            )["goodput_lifetime"]
            for k in range(noise_seeds)
        ]
        rows[p]["goodput_noise_band"] = [float(min(band)), float(max(band))] if band else None
        g = rows[p]["goodput_lifetime"]
        print(f"seed {case.seed} {p}: goodput engine {g['engine']:.3f}, simulator "
              f"{g['sim']:.3f}", flush=True)  # fmt: skip
    return rows


def _step_error(cost, steps: np.ndarray, mape) -> dict:  # noqa: ANN001
    """The cost model against the engine run's own steps: MAPE in % (all, decode-only, mixed)
    and the bias in % (modelled time over measured time, minus 1) of all steps and of the
    decode-only ones."""
    steps = steps[(steps[:, 0] + steps[:, 1]) > 0]  # as ``mape`` counts them
    modelled, measured = cost.predict_rows(steps), steps[:, -1]
    decode = steps[:, 0] == 0  # no prefill tokens

    def bias(sel: np.ndarray) -> float:
        return round(100 * float(modelled[sel].sum() / measured[sel].sum() - 1), 2)

    return {
        "count": int(len(steps)),
        "mape_pct": {k: round(v, 2) for k, v in mape(cost, steps).items()},
        "bias_pct": bias(np.ones(len(steps), dtype=bool)),
        "decode_bias_pct": bias(decode) if decode.any() else None,
    }


def _setting_of(m: Manifest) -> tuple:
    (case,) = m.of_role("headline")
    return (m.model, case.rate, json.dumps(m.scheduler, sort_keys=True), m.ttft_slo, m.itl_slo,
            sorted(m.policies), case.policies)  # fmt: skip


def _calibration(model: str) -> str:
    return f"calibration/h200_{model}_online.csv.gz"


def _write(result: dict, where: Path) -> None:
    """``headline_engine.json`` and the page rendered from it, into ``where``; prints the page."""
    from experiments.headline_page import write_page

    where.mkdir(parents=True, exist_ok=True)
    # every float as it is: a seed mean of 0.9915 rounded to any fewer digits shows as 0.992
    (where / "headline_engine.json").write_text(compact_json.dumps(result, None, sort_keys=False))
    doc = json.loads((where / "headline_engine.json").read_text())
    print(write_page(doc, where / "headline_engine.md"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--rate", type=float, default=None, help="default: policy_gain's load")
    e.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    e.add_argument("--out", default=OUT)
    e.add_argument(
        "--policies",
        nargs="+",
        default=None,
        choices=[name for name, _, _ in POLICIES],
        help="a subset (default: all)",
    )
    c = sub.add_parser("compare")
    c.add_argument("engine_root", nargs="?", default=ENGINE)
    c.add_argument("--out", default=None, help="default: results/headline_engine")
    c.add_argument(
        "--cost-scale", type=float, default=1.0, help="multiply every modelled step time"
    )
    c.add_argument(
        "--noise-seeds",
        type=int,
        default=0,
        help="also simulate each run with the engine's step scatter, seeds 0..N-1",
    )
    args = ap.parse_args(argv)
    if args.cmd == "export":
        export(args.rate, tuple(args.seeds), args.out, args.policies)
    else:
        compare(args.engine_root, args.out, args.cost_scale, args.noise_seeds)


if __name__ == "__main__":
    main()
