"""Tune every baseline with a knob, and Horizon, on the same budget; write the chosen configs.

    python -m experiments.policy_tuning [--jobs 2] [--quick]

Each policy of ``gain_settings.TUNING`` has six candidate settings of its knobs. Every
candidate's rate_at_90 (the highest Poisson rate at which lifetime goodput stays >= 0.9, by
bisection) is measured on the tuning seed (``TUNING_SEED``, a seed the headline does not
evaluate on) in the ``poisson`` setting; the candidate with the highest one wins (a tie: the
earlier, the shipped default first). The winner is written to ``configs/policy/tuned/<name>.yaml``
(what ``policy=tuned/<name>`` loads; the headline's rows use them), every candidate's figure to
``results/policy_gain/tuning.json``. ``--quick`` (CI-sized: 400 requests, 4 bisection steps)
writes under ``--out`` only, never into configs. Candidates already in ``--out``'s
``tuning.json`` with the same plan are not run again (``--fresh``: run them all).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.config_store import register_configs
from experiments.gain_runner import Plan, SeedTask, compose_run, run_tasks
from experiments.gain_settings import SETTINGS, TUNING, TUNING_SEED

REPO = Path(__file__).resolve().parents[1]
FULL = Plan(num_requests=4000, seeds=(TUNING_SEED,), iterations=8, lo=10.0, hi=170.0)
QUICK = Plan(num_requests=400, seeds=(TUNING_SEED,), iterations=4, lo=10.0, hi=170.0)


def candidates(only: list[str] | None = None) -> list[tuple[str, int, list[str]]]:
    """(tuned name, candidate index, hydra overrides) of every candidate, in TUNING's order."""
    out = []
    for name, (base, grid) in TUNING.items():
        if only and name not in only:
            continue
        out += [(name, i, [f"policy={base}", *opts]) for i, opts in enumerate(grid)]
    return out


def tune(plan: Plan, jobs: int, only: list[str] | None = None, known: dict | None = None) -> dict:
    """rate_at_90 of every candidate on the tuning seed and the chosen one per policy.

    ``known``: a previous ``tuning.json`` of the same plan; its candidates are not run again."""
    register_configs()
    cands = candidates(only)
    done = _measured(known, plan)
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        tasks = [
            SeedTask(f"{n}#{i}", compose_run([*SETTINGS["poisson"], *o]), TUNING_SEED, plan)
            for n, i, o in cands
            if (n, tuple(o[1:])) not in done
        ]
    rates = {r.row: r.rate_at_90 for r in run_tasks(tasks, jobs)}
    rates.update(
        {f"{n}#{i}": done[(n, tuple(o[1:]))] for n, i, o in cands if (n, tuple(o[1:])) in done}
    )
    out: dict = {}
    for name, i, overrides in cands:
        entry = out.setdefault(name, {"base": TUNING[name][0], "candidates": []})
        entry["candidates"].append({"overrides": overrides[1:], "rate_at_90": rates[f"{name}#{i}"]})
    for entry in out.values():
        cands = entry["candidates"]
        best = max(range(len(cands)), key=lambda k: cands[k]["rate_at_90"])
        entry["chosen"] = cands[best]["overrides"]  # max keeps the first of ties
    return out


def _measured(known: dict | None, plan: Plan) -> dict[tuple[str, tuple[str, ...]], float]:
    """(policy, overrides) -> rate_at_90 from ``known`` if it was measured with ``plan``."""
    if not known or known.get("plan") != _plan_doc(plan):
        return {}
    return {
        (name, tuple(c["overrides"])): c["rate_at_90"]
        for name, entry in known["policies"].items()
        for c in entry["candidates"]
    }


def _plan_doc(plan: Plan) -> dict:
    return {"num_requests": plan.num_requests, "seed": TUNING_SEED, "setting": "poisson",
            "iterations": plan.iterations, "lo": plan.lo, "hi": plan.hi}  # fmt: skip


def write_configs(result: dict, where: Path, stamp: str) -> None:
    """``<where>/<name>.yaml``: the policy config with the chosen options, a header saying so."""
    where.mkdir(parents=True, exist_ok=True)
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        for name, entry in result.items():
            node = compose("run", overrides=[f"policy={entry['base']}", *entry["chosen"]]).policy
            body = OmegaConf.to_yaml(node)  # interpolations (the artifact's path) kept
            tried = "; ".join(_short(c["overrides"]) for c in entry["candidates"])
            head = (
                f"# Written by experiments.policy_tuning ({stamp}): {entry['base']} with the\n"
                f"# options that kept the highest rate_at_90 on tuning seed {TUNING_SEED} "
                "(poisson setting).\n"
                f"# Chosen: {_short(entry['chosen'])}. Tried: {tried}.\n"
                "# Every candidate's figure: results/policy_gain/tuning.json.\n"
            )
            (where / f"{name}.yaml").write_text(head + body)


def _short(overrides: list[str]) -> str:
    return " ".join(o.removeprefix("policy.options.") for o in overrides)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI-sized; writes under --out only")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--only", action="append", default=None, help="tune only this policy")
    ap.add_argument("--fresh", action="store_true", help="run every candidate again")
    ap.add_argument("--out", default=str(REPO / "results" / "policy_gain"))
    args = ap.parse_args(argv)
    start = time.perf_counter()
    plan = QUICK if args.quick else FULL
    out = Path(args.out)
    previous = out / "tuning.json"
    known = json.loads(previous.read_text()) if previous.exists() and not args.fresh else None
    result = tune(plan, args.jobs, args.only, known)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d")
    doc = {
        "plan": _plan_doc(plan),
        "date": stamp,
        "policies": result,
        "wall_s": round(time.perf_counter() - start, 1),
    }
    (out / "tuning.json").write_text(json.dumps(doc, indent=1))
    configs = out / "tuned" if args.quick else REPO / "configs" / "policy" / "tuned"
    write_configs(result, configs, stamp)
    for name, entry in result.items():
        cells = ", ".join(
            f"{_short(c['overrides'])}: {c['rate_at_90']:g}" for c in entry["candidates"]
        )
        print(f"{name}: {cells} -> {_short(entry['chosen'])}")
    print(json.dumps({n: e["chosen"] for n, e in result.items()}))
    return doc


if __name__ == "__main__":
    main()
