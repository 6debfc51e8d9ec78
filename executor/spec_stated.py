"""``python -m executor.spec_bench --acceptance ...``: the held-batch grid under stated acceptance
(``executor.spec_held``) with its drafter, the crossovers, the draft cost, the JSON and the
table (printed last)."""

from __future__ import annotations

import json
from argparse import Namespace

from executor.spec_held import (
    HEAD,
    HeldWorkload,
    compare_simulated,
    crossovers,
    held_grid,
    ngram_drafter,
    row_text,
)

TARGET = (0.7, 4, 1, 2.0)  # issue 21: alpha, k, batch, speedup at least
DENSE_MAX_BATCH = 16  # the dense reference drafter loops over requests: slow beyond


def _draft_maker(a: Namespace, target):  # noqa: ANN001, ANN202
    """``(label, make(batch, max_len), draft model or None, the simulator's drafter key)`` of
    ``--drafter``; a preset draft shape gets the ``target``'s embedding rows
    (``draft_model_of``); ``eagle3``: a draft head on the target's width."""
    if a.drafter == "ngram":
        return "n-gram prompt lookup, padded to k", ngram_drafter, None, "ngram"
    from executor.model.config import preset_names
    from executor.paged_draft import PagedDraftModelDrafter, draft_model_of
    from executor.spec_bench import load_model

    if a.drafter == "eagle3":
        from executor.draft_head import draft_head_of

        draft = draft_head_of(target.config, a.dtype, a.device, seed=11)
        label = (
            "EAGLE-3-layout draft head on the target's width (1 layer, "
            f"{draft.draft_vocab:,}-token draft vocabulary; random weights, stand-in target "
            "features), paged, batched decode steps"
        )
        key = "eagle3"
    elif a.drafter.startswith("draft:"):
        name = a.drafter.split(":", 1)[1]
        if name in preset_names():
            vocab = target.config.vocab_size
            draft = draft_model_of(name, a.dtype, a.device, seed=11, vocab_size=vocab)
        else:
            draft, _ = load_model(name, a.dtype, a.device, seed=11)
        label, key = (
            f"draft model {name} (random weights), paged, batched decode steps",
            "draft_0.5b",
        )
    else:
        raise SystemExit(f"--drafter must be ngram, eagle3 or draft:NAME, got {a.drafter!r}")

    def make(batch: int, max_len: int) -> PagedDraftModelDrafter:
        ahead = a.draft_ahead == "on"
        return PagedDraftModelDrafter(draft, max_seqs=batch, max_len=max_len, draft_ahead=ahead)

    return label, make, draft, key


def main_stated(a: Namespace, batches: list[int], ks: list[int]) -> int:
    from executor.spec_bench import environment, load_model

    alphas = [float(x) for x in a.acceptance.split(",")]
    work = HeldWorkload(a.prompt_len, a.out_base, a.out_span)
    target, _ = load_model(a.model, a.dtype, a.device)
    label, make, draft, sim_key = _draft_maker(a, target)
    env = environment(a.device)
    stated = "stated acceptance α=" + ",".join(f"{x:g}" for x in alphas)
    on = a.verify_as_decode == "on"
    title = (
        f"{a.model} ({a.dtype}, {env.get('gpu', a.device)}), random weights: {stated} "
        f"(geometric, seed 0; not the target's), drafts: {label}; "
        f"verify {'as decode' if on else 'on the mixed path'}; held batch, "
        f"2B+6 requests, prompt {work.prompt}, outputs {work.out_base}.."
        f"{work.out_base + work.out_span - 1}"
    )
    print(title, flush=True)
    print(HEAD, flush=True)
    done: list[dict] = []

    def on_row(r: dict) -> None:  # printed, and the JSON so far (a run cut off keeps its rows)
        print(row_text(r), flush=True)
        done.append(r)
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump({"title": title, "partial": True, "rows": done}, f, indent=2)

    rows = held_grid(target, make, batches, ks, alphas, work, a.budget_s, on_row, on)
    cross = crossovers(rows, batches)
    sim_cross = _simulated_crossovers(a.compare, rows, batches, sim_key)
    costs = _draft_costs(a.draft_cost, draft, work, ks)
    a_t, k_t, b_t, x_t = TARGET
    hit = next((r for r in rows if (r.get("alpha"), r["k"], r["batch"]) == (a_t, k_t, b_t)), None)
    met = None if hit is None or hit.get("skipped") else hit["speedup"] >= x_t
    result = {**env, "title": title, "model": a.model, "dtype": a.dtype, "args": vars(a)}
    result |= {"acceptance": f"{stated} (geometric, seed 0)", "drafter": label}
    result["verify_as_decode"] = on
    result["draft_ahead"] = a.draft_ahead == "on"
    result |= {"rows": rows, "crossover_batch": cross, "draft_cost": costs}
    result |= {"simulated": a.compare, "crossover_batch_simulated": sim_cross}
    result |= {"target_alpha0.7_k4_batch1_ge_2x": met}
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(result, f, indent=2)
    print(f"\ncrossover batch (smallest measured batch slower than plain): {cross}")
    if sim_cross is not None:
        print(f"simulated ({a.compare}), same batches: {sim_cross}")
    if met is not None:
        print(f"alpha=0.7 k=4 batch 1: {hit['speedup']:.2f}x plain (target 2x: "
              f"{'met' if met else 'NOT met'})")  # fmt: skip
    print(title)
    print(HEAD)
    print("\n".join(row_text(r) for r in rows))
    return 0


def _simulated_crossovers(compare, rows: list[dict], batches: list[int], key: str):  # noqa: ANN001, ANN202
    """With ``--compare SIM.json``: each row gets the simulator's figures of drafter ``key``
    beside it; the simulated crossovers over the same batches (None without)."""
    if not compare:
        return None
    with open(compare) as f:
        sim = json.load(f)
    compare_simulated(rows, sim, key)
    sim_rows = [{**r, "speedup": r["sim_speedup"]} for r in rows if "sim_speedup" in r]
    return crossovers(sim_rows, batches)


def _draft_costs(batches_arg, draft, work: HeldWorkload, ks: list[int]):  # noqa: ANN001, ANN202
    """With ``--draft-cost B1,B2,..`` and a draft model: the paged and dense drafters' cost per
    position at those batches (``executor.draft_cost``); None otherwise."""
    if not batches_arg or draft is None:
        return None
    from executor.draft_cost import draft_costs
    from executor.draft_model import DraftModelDrafter
    from executor.model import CausalLM
    from executor.paged_draft import PagedDraftModelDrafter

    max_len = work.prompt + 16 * 14 + 32
    drafters = {"paged": lambda b: PagedDraftModelDrafter(draft, max_seqs=b, max_len=max_len)}
    if isinstance(draft, CausalLM):  # a whole decoder: also the dense reference drafter
        drafters["dense"] = lambda b: DraftModelDrafter(draft) if b <= DENSE_MAX_BATCH else None
    cost_batches = [int(x) for x in batches_arg.split(",")]
    return draft_costs(draft, drafters, cost_batches, work.prompt, max(ks))
