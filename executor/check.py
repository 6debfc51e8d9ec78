"""Correctness against HF transformers with identical random weights (GPU).

    python -m executor.check [--model qwen2.5-0.5b] [--dtypes bfloat16,float32] [--prompts 16]

Per dtype: our model and HF ``Qwen2ForCausalLM``/``LlamaForCausalLM`` share seeded random
weights (``export_hf_state_dict``). Reported:

* **argmax agreement** (teacher-forced): each prompt plus HF's greedy continuation goes through
  our paged runner (prompt in chunks over the paged context, interleaved with other sequences'
  decode steps; the continuation token by token as decode steps, from CUDA graphs) and through
  HF in one forward; the share of positions whose argmax agrees.
* **continuation match**: the share of prompts whose ``--continuation``-token greedy
  continuation from our engine equals HF ``generate``'s exactly.
* In bf16 also the agreement of each with HF in fp32 on the same sequences: random weights give
  near-flat logits, so near-ties are common and bf16 rounding alone flips some argmaxes.

The last line is one JSON object with the figures.

    python -m executor.check --named smollm2-135m-instruct [--continuation 32]

With ``--named``, a model with real weights (``executor.named_models``) against HF loading the
same GGUF file, in fp32 (on the GPU when there is one, else on the CPU with the torch attention
backend): argmax agreement as above over chat and plain prompts, and each prompt's greedy
continuation from both, side by side (neither stops at end-of-sequence).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import torch

from executor.model import CausalLM, ModelConfig
from executor.runner import ModelRunner
from horizon.plan import StepPlan
from horizon.request import Request


def teacher_forced_argmax(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    chunk: int,
    first_block: int = 0,
    keep_logits: bool = False,
) -> list[torch.Tensor]:
    """Per-position argmax of our logits for each ``prompt + continuation`` (fp32 logits when
    ``keep_logits``), through the runner as the engine drives it.

    Each step, every sequence still in its prompt computes its next ``chunk`` tokens (eager,
    all-token logits) and every other sequence decodes its next forced continuation token; steps
    with decodes only go through the decode path (CUDA graphs on the GPU). Sequence ``i`` uses
    blocks from ``first_block`` on, contiguous; the runner's KV tensor must hold them all.
    Leaves the runner empty.
    """
    bs = runner.block_size
    reqs, tables, block = [], {}, first_block
    for i, (p, c) in enumerate(zip(prompts, continuations)):
        r = Request(i, 0.0, len(p), len(c) + 1, len(c) + 1, prompt_token_ids=tuple(p))
        n = -(-(len(p) + len(c)) // bs)
        tables[i] = list(range(block, block + n))
        block += n
        reqs.append(r)
    rows: list[list[torch.Tensor]] = [[] for _ in reqs]
    forced = [0] * len(reqs)  # continuation tokens fed so far
    step = 0
    while True:
        decodes = [
            r
            for r in reqs
            if r.num_output_tokens and forced[r.request_id] < len(continuations[r.request_id])
        ]
        prefills = [(r, min(chunk, r.num_tokens_to_compute)) for r in reqs if r.is_prefill]
        if not decodes and not prefills:
            break
        for r in decodes:  # feed the next forced token
            runner.append_tokens([r], [continuations[r.request_id][forced[r.request_id]]])
            forced[r.request_id] += 1
        plan = StepPlan(step, 0.0, tuple(decodes), tuple(prefills))
        out = runner.execute(
            plan, lambda r: tables[r.request_id], commit=False, all_logits=bool(prefills)
        )
        logits = out.all_logits if prefills else out.logits
        sizes = [1] * len(decodes) + [n for _, n in prefills]
        for r, rows_i in zip(decodes + [r for r, _ in prefills], logits.split(sizes)):
            rows[r.request_id].append(rows_i.float() if keep_logits else rows_i.argmax(-1))
        for r, n in prefills:  # a prompt's last chunk emits; its continuation is forced next
            r.advance(n)
        for r in decodes:
            r.advance(1)
        step += 1
    for r in reqs:
        runner.release(r)
    return [torch.cat(x) for x in rows]


# -- the GPU check --------------------------------------------------------------------------------
def _hf_model(config: ModelConfig, dtype: torch.dtype, model: CausalLM):
    """HF's model of ``config`` in ``dtype`` on ``model``'s device, holding ``model``'s weights."""
    import transformers

    from executor.weights import export_hf_state_dict

    hf_config = transformers.AutoConfig.for_model(**config.to_hf_config())
    with torch.device(model.embed_tokens.weight.device):
        try:
            hf = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
        except TypeError:  # transformers 4.x
            hf = transformers.AutoModelForCausalLM.from_config(hf_config, torch_dtype=dtype)
    hf.eval()
    result = hf.load_state_dict(export_hf_state_dict(model), strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    assert set(result.missing_keys) <= {"lm_head.weight"}, result.missing_keys
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf


@torch.no_grad()
def _hf_argmax(hf, seqs: Sequence[Sequence[int]]) -> list[torch.Tensor]:  # noqa: ANN001
    dev = next(hf.parameters()).device
    return [hf(torch.tensor([s], device=dev)).logits[0].float().argmax(-1) for s in seqs]


@torch.no_grad()
def _hf_greedy(hf, prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:  # noqa: ANN001
    dev = next(hf.parameters()).device
    out = []
    for p in prompts:
        ids = torch.tensor([p], device=dev)
        gen = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
        out.append(gen[0, len(p) :].tolist())
    return out


def _agree(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    same = sum(int((x.to(y.device) == y).sum()) for x, y in zip(a, b))
    return same / sum(len(y) for y in b)


def check_dtype(name: str, dtype: str, prompts: list[list[int]], n_cont: int, seed: int) -> dict:
    from executor.bench import device_random_weights
    from executor.engine import Engine, EngineConfig

    torch_dtype = getattr(torch, dtype)
    config = ModelConfig.for_preset(name).with_dtype(dtype)
    model = CausalLM(config, device="cuda", dtype=torch_dtype)
    device_random_weights(model, seed)
    hf = _hf_model(config, torch_dtype, model)
    t0 = time.perf_counter()
    hf_cont = _hf_greedy(hf, prompts, n_cont)
    seqs = [p + c for p, c in zip(prompts, hf_cont)]
    hf_arg = _hf_argmax(hf, seqs)
    max_len = max(len(s) for s in seqs) + 16
    engine = Engine(
        model,
        EngineConfig(
            num_blocks=2 * sum(-(-len(s) // 16) + 1 for s in seqs) + 64,
            max_num_seqs=64,
            max_num_batched_tokens=2048,
            max_model_len=max_len,
        ),
    )
    reqs = [
        Request(i, 0.0, len(p), n_cont, n_cont, prompt_token_ids=tuple(p))
        for i, p in enumerate(prompts)
    ]
    engine.run_offline(reqs)
    ours_cont = [engine.outputs[i] for i in range(len(prompts))]
    first = sum(-(-len(s) // 16) for s in seqs) + 1
    ours_arg = teacher_forced_argmax(engine.runner, prompts, hf_cont, chunk=96, first_block=first)
    res = {
        "dtype": dtype,
        "positions": sum(len(a) for a in hf_arg),
        "argmax_agreement": _agree(ours_arg, hf_arg),
        "continuation_match": sum(a == b for a, b in zip(ours_cont, hf_cont)) / len(prompts),
        "continuation_token_agreement": sum(
            sum(x == y for x, y in zip(a, b)) for a, b in zip(ours_cont, hf_cont)
        )
        / (n_cont * len(prompts)),
    }
    if torch_dtype != torch.float32:  # the bf16 noise floor: both against HF in fp32
        hf.float()
        ref = _hf_argmax(hf, seqs)
        res["ours_vs_hf_fp32"] = _agree(ours_arg, ref)
        res["hf_vs_hf_fp32"] = _agree(hf_arg, ref)
    res["fused_vs_reference"] = fused_parity(model, seed)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    del hf, engine, model
    torch.cuda.empty_cache()
    return res


@torch.no_grad()
def fused_parity(model: CausalLM, seed: int = 0) -> dict:
    """``FusedForward`` against ``model.forward`` on one random flat batch (dense attention):
    the share of bit-identical hidden values and the largest difference."""
    from executor.fused import FusedForward
    from executor.model import DenseAttention, DenseKVCache

    dev = model.embed_tokens.weight.device
    g = torch.Generator().manual_seed(seed)
    lens = [200, 1, 57]
    ids = torch.randint(0, model.config.vocab_size, (sum(lens),), generator=g).to(dev)
    positions = torch.cat([torch.arange(n) for n in lens]).to(dev)
    out = []
    for forward in (model, FusedForward(model)):
        caches = [DenseKVCache(model.config.num_layers) for _ in lens]
        out.append(
            forward(ids, positions, DenseAttention(lens, caches, model.config.attention_scale))
        )
    diff = (out[0].float() - out[1].float()).abs()
    return {"identical": float((diff == 0).float().mean()), "max_abs": float(diff.max())}


# -- a named model with real weights against HF on the same GGUF file -------------------------
NAMED_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
)
NAMED_CHAT_PROMPTS = (
    "What is the boiling point of water at sea level?",
    "Write a haiku about autumn.",
    "Name three planets of the solar system.",
    "Explain in one sentence what a CPU does.",
)


def hf_gguf_model(path, device="cpu"):  # noqa: ANN001, ANN201
    """HF ``AutoModelForCausalLM`` of the GGUF file at ``path`` (dequantized by transformers'
    own loader), fp32, eval mode, on ``device``."""
    from pathlib import Path

    import transformers

    path = Path(path)
    load = transformers.AutoModelForCausalLM.from_pretrained
    try:
        hf = load(path.parent, gguf_file=path.name, dtype=torch.float32)
    except TypeError:  # transformers 4.x
        hf = load(path.parent, gguf_file=path.name, torch_dtype=torch.float32)
    return hf.to(device=device, dtype=torch.float32).eval()


@torch.no_grad()
def _hf_greedy_no_stop(hf, prompt: Sequence[int], n: int) -> list[int]:  # noqa: ANN001
    """``n`` greedy tokens, end-of-sequence included (no stopping), each from a full forward
    of the sequence so far (no KV cache: the plainest reference, and no cache API to track)."""
    dev = next(hf.parameters()).device
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(hf(torch.tensor([seq], device=dev)).logits[0, -1].argmax()))
    return seq[len(prompt) :]


def named_prompt_ids(tokenizer, plain: Sequence[str], chat: Sequence[str]) -> list[list[int]]:  # noqa: ANN001
    """Plain prompts as they are, chat prompts as one user turn through the chat template."""
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": c}]) for c in chat]
    return [tokenizer.encode(t) for t in [*plain, *chats]]


def named_parity(
    model: CausalLM, tokenizer, hf, prompts: list[list[int]], n_cont: int, chunk: int = 8
) -> dict:  # noqa: ANN001
    """Our engine (``model``, greedy, ``stop="trace"``) against ``hf`` on ``prompts``:
    teacher-forced argmax agreement over every position of prompt + HF's continuation (our
    prompts in ``chunk``-token pieces over the paged context), and each prompt's ``n_cont``-token
    greedy continuation from both, as ids and text."""
    from executor.engine import Engine, EngineConfig

    hf_cont = [_hf_greedy_no_stop(hf, p, n_cont) for p in prompts]
    seqs = [p + c for p, c in zip(prompts, hf_cont)]
    hf_arg = _hf_argmax(hf, seqs)
    per_seq = [-(-len(s) // 16) + 1 for s in seqs]
    engine = Engine(
        model,
        EngineConfig(
            num_blocks=2 * sum(per_seq) + 8,
            max_num_seqs=len(prompts),
            max_num_batched_tokens=1024,
            max_model_len=max(len(s) for s in seqs) + 16,
        ),
    )
    reqs = [
        Request(i, 0.0, len(p), n_cont, n_cont, prompt_token_ids=tuple(p))
        for i, p in enumerate(prompts)
    ]
    engine.run_offline(reqs)
    ours = [engine.outputs[i] for i in range(len(prompts))]
    ours_arg = teacher_forced_argmax(
        engine.runner, prompts, hf_cont, chunk, first_block=sum(per_seq)
    )
    return {
        "positions": sum(len(a) for a in hf_arg),
        "argmax_agreement": _agree(ours_arg, hf_arg),
        "continuations_identical": sum(a == b for a, b in zip(ours, hf_cont)),
        "prompts": len(prompts),
        "side_by_side": [
            {
                "prompt": tokenizer.decode(p, skip_special=False),
                "ours": tokenizer.decode(a, skip_special=False),
                "hf": tokenizer.decode(b, skip_special=False),
            }
            for p, a, b in zip(prompts, ours, hf_cont)
        ],
        "ours_ids": ours,
        "hf_ids": hf_cont,
    }


def check_named(name: str, n_cont: int) -> dict:
    """``named_parity`` of the named model (fp32) on ``NAMED_PROMPTS`` + ``NAMED_CHAT_PROMPTS``,
    on the GPU when there is one, else on the CPU."""
    from executor.named_models import load_named, smollm2_path

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model, tokenizer = load_named(name, dtype="float32", device=device)
    hf = hf_gguf_model(smollm2_path(), device)
    prompts = named_prompt_ids(tokenizer, NAMED_PROMPTS, NAMED_CHAT_PROMPTS)
    res = named_parity(model, tokenizer, hf, prompts, n_cont)
    res["device"], res["seconds"] = device, round(time.perf_counter() - t0, 1)
    return res


def random_prompts(n: int, vocab: int, seed: int, lo: int = 8, hi: int = 400) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lengths]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m executor.check", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", default="qwen2.5-0.5b")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--continuation", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--named", default=None, help="a named model with real weights, e.g. smollm2-135m-instruct"
    )
    a = p.parse_args(argv)
    if a.named:
        return _main_named(a.named, a.continuation)
    if not torch.cuda.is_available():
        print("executor.check needs a CUDA GPU", file=sys.stderr)
        return 2
    vocab = ModelConfig.for_preset(a.model).vocab_size
    prompts = random_prompts(a.prompts, vocab, a.seed)
    results = []
    for dtype in a.dtypes.split(","):
        r = check_dtype(a.model, dtype, prompts, a.continuation, a.seed)
        print(
            f"{a.model} {dtype}: argmax agreement {r['argmax_agreement']:.4f} over "
            f"{r['positions']} positions; {a.continuation}-token continuations equal "
            f"{r['continuation_match']:.3f} (tokens {r['continuation_token_agreement']:.3f})"
            + (
                f"; vs HF fp32: ours {r['ours_vs_hf_fp32']:.4f}, HF bf16 {r['hf_vs_hf_fp32']:.4f}"
                if "ours_vs_hf_fp32" in r
                else ""
            ),
            flush=True,
        )
        results.append(r)
    print(json.dumps({"model": a.model, "prompts": a.prompts, "results": results}))
    return 0


def _main_named(name: str, n_cont: int) -> int:
    r = check_named(name, n_cont)
    for row in r["side_by_side"]:
        print(f"--- prompt: {row['prompt']!r}")
        print(f"    ours: {row['ours']!r}")
        print(f"    hf:   {row['hf']!r}")
    print(
        f"{name} float32 on {r['device']}: argmax agreement {r['argmax_agreement']:.4f} over "
        f"{r['positions']} positions; {n_cont}-token greedy continuations identical "
        f"{r['continuations_identical']}/{r['prompts']} ({r['seconds']} s)",
        flush=True,
    )
    print(json.dumps({"model": name, **{k: v for k, v in r.items() if k != "side_by_side"}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
