"""Speculative decoding against the plain engine, same model, same prompts, same run.

    python -m executor.spec_bench [--model smollm2-135m-instruct] [--batch 1,4,16,64]
        [--k 1,2,4,8] [--dtype float32] [--repeats 2] [--json-out PATH]
    python -m executor.spec_bench --model tiny --device cpu --batch 1,2 --k 1,2 --max-new 24

Random-weight targets, stated acceptance (``--acceptance``: the held-batch grid of
``executor.spec_held``, ``experiments.spec_crossover``'s workload; every row is labelled
"stated acceptance α=.."; the drafter's and the verification's costs are real)::

    python -m executor.spec_bench --model qwen2.5-7b --dtype bfloat16 \
        --drafter draft:qwen2.5-0.5b --acceptance 0.7 --k 4 --batch 1,2,4,8,16,32,64
    python -m executor.spec_bench --model qwen2.5-7b --dtype bfloat16 --drafter ngram \
        --acceptance 0.5,0.7,0.9 --k 4 --batch 1,4,16,64
    python -m executor.spec_bench --model tiny --device cpu --drafter draft:tiny \
        --acceptance 0.7 --k 2 --batch 1,2 --prompt-len 24 --out-base 4 --out-span 8

``--verify-as-decode off``: verification steps without prefill chunks take the mixed path
(ragged prefill kernel, mixed-step graphs) instead of running as expanded decode steps
(``EngineConfig.verify_as_decode``, on by default); every row counts its verification steps by
path (``verify_steps``).

``--drafter draft:NAME``: a draft model (a preset shape with seeded random weights, or
``tiny``) on its own paged KV cache, batched graph-replayed decode steps
(``executor.paged_draft``); ``eagle3``: a draft head in EAGLE-3's layout on the target's
width on the same paged cache (``executor.draft_head``: one decoder layer, a 32,000-token
draft vocabulary); ``ngram``: prompt lookup padded to ``k``. ``--draft-cost B,..``:
also each draft model drafter's ms per draft position against the draft model's own plain
engine decode step at those batch sizes (``executor.draft_cost``). ``--budget-s``: cells not
started by then are skipped (listed as such). ``--compare results/spec_crossover/sim.json``:
the simulator's speedup and accepted drafts of each cell beside the engine's, and its
crossovers over the same batches.

Workload: "repeat / copy / proofread this text" chat prompts over seeded paragraphs of fixed
sentences (``--model tiny``: seeded random token sequences repeated 4 times; its random weights
do not copy them, so its figures only test the script). Drafts: n-gram prompt lookup
(``executor.drafter.NgramDrafter``, n 3..1), so acceptance is real and measured.

For each batch size ``B`` (``B`` requests, offline, FCFS, one engine sized for them, graphs
captured first):

1. reference: the plain engine, serially, stopping at end-of-sequence or ``--max-new`` tokens:
   each request's output length (a warm-up, not timed);
2. plain: the plain engine as it runs by default (pipelined, CUDA graphs), every request forced
   to its reference length (``stop="trace"``), best wall time of ``--repeats``;
3. for each ``k``: the same with speculation (``fixed`` policy, ``k`` drafts per request per
   step; serial steps; verification steps replay the expanded-decode graphs, or the
   mixed-step graphs when they carry prefill chunks), outputs compared
   token for token with plain's (greedy: they must be equal, ``identical``).

Figures per row: ``tok_s`` (output tokens / wall time, prefill included), ``speedup`` (over
plain at that batch), ``steps``, ``acceptance`` (accepted / proposed drafts as the scheduler
counted them: a draft the n-gram drafter could not propose counts as rejected),
``proposal_acceptance`` (accepted / drafts the drafter did propose), ``tokens_per_step``
(output tokens per step). The table is printed last; ``--json-out`` writes every figure
with the GPU, versions and date. Target (issue 21): >= 1.5x plain at batch 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time

import numpy as np
import torch

from executor.drafter import NgramDrafter
from horizon.request import Request
from horizon.speculation import SpeculationConfig

SENTENCES = (
    "The scheduler decides which requests run in each step of the engine.",
    "Every block of the cache holds the keys and values of sixteen tokens.",
    "A request that cannot get a block is preempted and computed again later.",
    "The river ran quietly under the old stone bridge near the village.",
    "She packed two apples, a loaf of bread and a flask of tea for the walk.",
    "Chunked prefill lets long prompts share a step with running decodes.",
    "The committee will meet again on Thursday to review the budget.",
    "Rain is expected in the north, with clear skies in the south by evening.",
    "The library opens at nine in the morning and closes at six.",
    "A small model proposes tokens that a larger model then verifies.",
    "He wrote the results in a notebook and checked them twice.",
    "The train to the coast leaves from platform four every hour.",
    "Throughput rises with the batch size until the memory bandwidth is spent.",
    "The garden was full of roses, tulips and tall yellow sunflowers.",
    "Please send the signed form back to the office before Friday.",
    "The cat slept on the windowsill while the sun warmed the room.",
    "Each step reads the weights once, whatever the number of requests.",
    "The bakery on the corner sells fresh bread and sweet pastries.",
    "Our team fixed the bug, wrote a test and shipped the release.",
    "The museum shows paintings from the sixteenth and seventeenth centuries.",
)
TASKS = (
    "Repeat the following text exactly, word for word:",
    "Copy this text without changing anything:",
    "Proofread the following text and write it out again:",
)


def text_prompts(tokenizer, n: int, seed: int) -> list[list[int]]:  # noqa: ANN001
    """``n`` chat prompts, each a task and a paragraph of 6 seeded sentences."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sents = rng.choice(len(SENTENCES), 6, replace=False)
        text = " ".join(SENTENCES[j] for j in sents)
        msg = f"{TASKS[i % len(TASKS)]}\n\n{text}"
        out.append(
            tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": msg}]))
        )
    return out


def token_prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    """``n`` prompts of a seeded 20-token sequence repeated 4 times (no tokenizer)."""
    rng = np.random.default_rng(seed)
    return [np.tile(rng.integers(0, vocab, 20), 4).tolist() for _ in range(n)]


def load_model(name: str, dtype: str, device: str, seed: int = 7):  # noqa: ANN201
    """``(model, tokenizer or None)``: a named model's real weights, ``tiny`` or a preset shape
    (``executor.model.config``, e.g. ``qwen2.5-7b``) with seeded random weights."""
    from executor.model.config import preset_names

    if name == "tiny":
        from executor.model import CausalLM
        from executor.model.testing import tiny_config
        from executor.weights import random_weights

        model = CausalLM(tiny_config(), device=device, dtype=getattr(torch, dtype))
        random_weights(model, seed, std=0.2)
        return model.eval(), None
    if name in preset_names():
        from executor.paged_draft import draft_model_of

        return draft_model_of(name, dtype, device, seed), None
    from executor.named_models import load_named

    return load_named(name, dtype=dtype, device=device)


def make_engine(model, batch: int, max_len: int, **config):  # noqa: ANN001, ANN003, ANN201
    """An engine sized for ``batch`` requests of ``max_len`` tokens; an n-gram drafter set."""
    from executor.engine import Engine, EngineConfig

    per_req = -(-max_len // 16)
    cfg = EngineConfig(
        num_blocks=batch * per_req + 64,
        max_num_seqs=max(batch, 8),
        max_num_batched_tokens=1024,
        max_model_len=max_len + 16,
        **config,
    )
    engine = Engine(model, cfg)
    engine.runner.drafter = NgramDrafter()
    return engine


def _requests(prompts: list[list[int]], lengths: list[int]) -> list[Request]:
    return [
        Request(i, 0.0, len(p), n, n, prompt_token_ids=tuple(p))
        for i, (p, n) in enumerate(zip(prompts, lengths))
    ]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(engine, prompts, lengths, k: int, repeats: int) -> dict:  # noqa: ANN001
    """Best of ``repeats`` offline runs forced to ``lengths``: speculation with ``k`` drafts
    (0: the plain engine, as configured)."""
    base = engine.config
    spec = SpeculationConfig(policy="fixed", num_draft_tokens=k) if k else None
    engine.config = dataclasses.replace(base, speculation=spec, stop="trace")
    best = None
    try:
        for _ in range(repeats):
            _sync()
            t0 = time.perf_counter()
            rec = engine.run_offline(_requests(prompts, lengths))
            _sync()
            wall = time.perf_counter() - t0
            if best is None or wall < best["wall_s"]:
                s = engine.scheduler
                tokens = int(rec.num_output_tokens.sum())
                steps = len(rec.step_durations())
                best = {
                    "k": k,
                    "wall_s": wall,
                    "tok_s": tokens / wall,
                    "tokens": tokens,
                    "steps": steps,
                    "tokens_per_step": tokens / steps,
                    "drafted": s.num_drafted,
                    "accepted": s.num_accepted,
                    "acceptance": s.num_accepted / s.num_drafted if s.num_drafted else None,
                    "proposed": engine.runner.num_proposed,
                    "proposal_acceptance": engine.runner.num_accepted / engine.runner.num_proposed
                    if engine.runner.num_proposed
                    else None,
                    "verify_steps": dict(engine.runner.num_verify_steps),
                    "outputs": dict(engine.outputs),
                }
    finally:
        engine.config = base
    return best


def bench_batch(model, tokenizer, batch: int, ks, args) -> list[dict]:  # noqa: ANN001
    """The plain and speculative rows of one batch size."""
    if tokenizer is not None:
        prompts = text_prompts(tokenizer, batch, args.seed + batch)
        stop, eos = "eos", frozenset(model.config.eos_token_ids)
    else:
        prompts = token_prompts(model.config.vocab_size, batch, args.seed + batch)
        stop, eos = "trace", frozenset()
    max_len = max(len(p) for p in prompts) + args.max_new
    engine = make_engine(model, batch, max_len, verify_as_decode=args.verify_as_decode == "on")
    t0 = time.perf_counter()
    engine.warmup(max_drafts=max(ks))
    graphs_s = time.perf_counter() - t0
    ref = dataclasses.replace(engine.config, stop=stop, async_steps=False)
    plain_cfg, engine.config = engine.config, ref
    engine.run_offline(_requests(prompts, [args.max_new] * batch))
    engine.config = plain_cfg
    lengths = [len(engine.outputs[i]) for i in range(batch)]
    if eos:  # a reference output ending at EOS: forced to its length it emits the same tokens
        assert all(engine.outputs[i][-1] in eos or n == args.max_new for i, n in enumerate(lengths))
    plain = timed(engine, prompts, lengths, 0, args.repeats)
    plain_out = plain.pop("outputs")
    rows = []
    for k in [0, *ks]:
        r = plain if k == 0 else timed(engine, prompts, lengths, k, args.repeats)
        outs = r.pop("outputs") if k else plain_out
        same = sum(outs[i] == plain_out[i] for i in range(batch))
        r["first_divergence"] = min(
            (_diverge(outs[i], plain_out[i]) for i in range(batch) if outs[i] != plain_out[i]),
            default=None,
        )
        r |= {"batch": batch, "speedup": r["tok_s"] / plain["tok_s"], "graphs_s": graphs_s}
        r |= {"identical": same == batch, "num_identical": same}
        rows.append(r)
        print(_row(r), flush=True)
    del engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def _diverge(a: list[int], b: list[int]) -> int:
    """The first output position where ``a`` and ``b`` differ."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


HEAD = (
    f"{'batch':>5} {'k':>3} {'tok/s':>10} {'x plain':>8} {'steps':>6} {'tok/step':>9} "
    f"{'accept':>7} {'identical':>10}"
)


def _row(r: dict) -> str:
    acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
    k = "-" if r["k"] == 0 else str(r["k"])
    same = f"{r['num_identical']}/{r['batch']}"
    return (
        f"{r['batch']:>5} {k:>3} {r['tok_s']:>10,.0f} {r['speedup']:>8.2f} {r['steps']:>6} "
        f"{r['tokens_per_step']:>9.2f} {acc:>7} {same:>10}"
    )


def environment(device: str) -> dict:
    env = {"torch": torch.__version__, "date": datetime.date.today().isoformat()}
    if device.startswith("cuda"):
        import triton

        env |= {"gpu": torch.cuda.get_device_name(0), "triton": triton.__version__}
    return env


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m executor.spec_bench", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", default="smollm2-135m-instruct", help="a named model, or tiny")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", help="float32 (the greedy check) or bfloat16")
    p.add_argument("--batch", default="1,4,16,64")
    p.add_argument("--k", default="1,2,4,8")
    p.add_argument("--max-new", type=int, default=256, help="output cap of the reference run")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    p.add_argument(
        "--drafter", default="ngram", help="ngram, eagle3 or draft:NAME (stated grid only)"
    )
    p.add_argument("--acceptance", default=None, help="stated alphas: the held-batch grid")
    p.add_argument("--prompt-len", type=int, default=512, help="held grid: prompt tokens")
    p.add_argument("--out-base", type=int, default=128, help="held grid: shortest output")
    p.add_argument("--out-span", type=int, default=256, help="held grid: output length spread")
    p.add_argument("--budget-s", type=float, default=None, help="held grid: skip cells after")
    p.add_argument("--draft-cost", default=None, help="batches for the draft cost per position")
    p.add_argument("--compare", default=None, help="held grid: the simulator's sim.json")
    p.add_argument(
        "--verify-as-decode",
        choices=("on", "off"),
        default="on",
        help="verification steps without chunks as expanded decode steps (off: the mixed path)",
    )
    p.add_argument(
        "--draft-ahead",
        choices=("on", "off"),
        default="on",
        help="a draft model's next proposals launched right after each verification",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    batches = [int(x) for x in a.batch.split(",")]
    ks = [int(x) for x in a.k.split(",")]
    if a.device == "cpu":
        torch.set_num_threads(1)
    if a.acceptance is not None:
        from executor.spec_stated import main_stated

        return main_stated(a, batches, ks)
    if a.drafter != "ngram":
        p.error("--drafter other than ngram needs --acceptance (random-weight targets)")
    model, tokenizer = load_model(a.model, a.dtype, a.device)
    env = environment(a.device)
    paths = "verify as decode" if a.verify_as_decode == "on" else "verify on the mixed path"
    print(
        f"{a.model} ({a.dtype}, {env.get('gpu', a.device)}): n-gram drafting, {paths}", flush=True
    )
    print(HEAD, flush=True)
    rows = [r for b in batches for r in bench_batch(model, tokenizer, b, ks, a)]
    b1 = [r for r in rows if r["batch"] == 1 and r["k"]]
    best = max(b1, key=lambda r: r["speedup"]) if b1 else None
    target = None if best is None else best["speedup"] >= 1.5
    result = {**env, "model": a.model, "dtype": a.dtype, "device": a.device, "args": vars(a)}
    result["verify_as_decode"] = a.verify_as_decode == "on"
    result |= {"rows": rows, "batch1_best": best, "target_batch1_ge_1.5x": target}
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(result, f, indent=2)
    all_same = all(r["identical"] for r in rows)
    print(f"\ngreedy outputs identical to plain in every cell: {all_same}")
    if best is not None:
        verdict = "met" if target else "NOT met"
        print(
            f"batch 1: best k={best['k']} at {best['speedup']:.2f}x plain (target 1.5x: {verdict})"
        )
    print(HEAD)
    print("\n".join(_row(r) for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
