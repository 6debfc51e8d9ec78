"""Tensor parallelism of the decoder over ``torch.distributed`` (Megatron's split).

``shard(model, rank, world)`` is rank ``rank``'s part of ``model``: the fused QKV projection
keeps the rows of the rank's query heads and of the KV heads they read (column-parallel), the
output projection the matching columns (row-parallel); the MLP's gate and up rows and the down
projection's columns are split by ``intermediate_size / world``. Each row-parallel projection
sums its partial products across ranks (one all-reduce after attention, one after the MLP: two
per layer) and then adds its bias once. Embedding, norms and LM head are replicated, so every
rank ends a forward with the same hidden states and logits.

Grouped-query attention: with ``num_kv_heads >= world`` the KV heads are split too; with
fewer KV heads than ranks (``world % num_kv_heads == 0``) each rank keeps the one KV head its
query heads share, replicated on ``world / num_kv_heads`` ranks.

What is here is the model's split, run by any ``Attention`` over the rank's heads (each rank
holds its heads' KV cache), and so by the engine: an ``Engine`` over a rank's part keeps a KV
tensor of the rank's heads. Offline runs (every request queued at the start) need no plan to
travel: each rank's scheduler makes the same plans from the same requests. Online (wall-clock)
runs have one scheduler, rank 0's, which broadcasts each step (``executor.plan_broadcast``);
``online_run`` is such a run. Not yet: CUDA graphs per rank (each rank's runner captures its
own, untested on GPUs).

    python -m executor.tensor_parallel --world 2     # gloo on the CPU: TP=2 against TP=1
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from executor.model import CausalLM, ModelConfig


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which heads and MLP rows rank ``rank`` of ``world`` keeps."""

    rank: int
    world: int
    q_heads: range
    kv_heads: range
    mlp_rows: range  # of ``intermediate_size``


def layout(config: ModelConfig, rank: int, world: int) -> Layout:
    """Rank ``rank``'s part (see the module docstring).

    Raises:
        ValueError: a dimension ``world`` does not divide (naming it), or a bad rank.
    """
    if not (isinstance(world, int) and world >= 1 and 0 <= rank < world):
        raise ValueError(f"tensor parallel: rank {rank!r} of world {world!r}")
    h, k, i = config.num_heads, config.num_kv_heads, config.intermediate_size
    for name, v in (("num_heads", h), ("intermediate_size", i)):
        if v % world:
            raise ValueError(f"tensor parallel: {name} {v} is not divisible by world {world}")
    if k >= world and k % world:
        raise ValueError(f"tensor parallel: num_kv_heads {k} is not divisible by world {world}")
    if k < world and world % k:
        raise ValueError(f"tensor parallel: world {world} is not a multiple of num_kv_heads {k}")
    qp = h // world
    q = range(rank * qp, (rank + 1) * qp)
    if k >= world:
        kp = k // world
        kv = range(rank * kp, (rank + 1) * kp)
    else:
        first = q.start // (h // k)  # the KV head this rank's query heads share
        kv = range(first, first + 1)
    ip = i // world
    return Layout(rank, world, q, kv, range(rank * ip, (rank + 1) * ip))


class RowParallelLinear(nn.Module):
    """``x @ weight.T`` summed across ``group``'s ranks, then ``bias`` (whole) added once."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group=None) -> None:  # noqa: ANN001
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        dist.all_reduce(y, group=self.group)
        return y if self.bias is None else y + self.bias


def shard(model: CausalLM, rank: int, world: int, group=None) -> CausalLM:  # noqa: ANN001
    """Rank ``rank``'s model (new parameters; ``model`` is unchanged). Its forward needs the
    process group ``group`` (default: the world) of ``world`` ranks initialised."""
    cfg = model.config
    lay = layout(cfg, rank, world)
    shape = dataclasses.replace(
        cfg.shape,
        num_heads=len(lay.q_heads),
        num_kv_heads=len(lay.kv_heads),
        intermediate_size=len(lay.mlp_rows),
    )
    p = next(model.parameters())
    part = CausalLM(dataclasses.replace(cfg, shape=shape), device=p.device, dtype=p.dtype)
    with torch.no_grad():
        part.embed_tokens.weight.copy_(model.embed_tokens.weight)
        part.norm.weight.copy_(model.norm.weight)
        if model.lm_head is not None:
            part.lm_head.weight.copy_(model.lm_head.weight)
        for mine, whole in zip(part.layers, model.layers):
            _shard_layer(mine, whole, cfg, lay, group)
    return part.eval()


def _shard_layer(mine: nn.Module, whole: nn.Module, cfg: ModelConfig, lay: Layout, group) -> None:  # noqa: ANN001
    d, q_size, kv_size = cfg.head_dim, cfg.q_size, cfg.kv_size
    mine.input_layernorm.weight.copy_(whole.input_layernorm.weight)
    mine.post_attention_layernorm.weight.copy_(whole.post_attention_layernorm.weight)
    q = _rows(lay.q_heads, d)
    rows = torch.cat(
        [q, q_size + _rows(lay.kv_heads, d), q_size + kv_size + _rows(lay.kv_heads, d)]
    )
    attn, qkv = whole.self_attn, whole.self_attn.qkv_proj
    mine.self_attn.qkv_proj.weight.copy_(qkv.weight[rows])
    if qkv.bias is not None:
        mine.self_attn.qkv_proj.bias.copy_(qkv.bias[rows])
    o = attn.o_proj
    mine.self_attn.o_proj = RowParallelLinear(o.weight[:, q].clone(), _copy(o.bias), group)
    i = cfg.intermediate_size
    mlp = torch.arange(lay.mlp_rows.start, lay.mlp_rows.stop)
    mine.mlp.gate_up_proj.weight.copy_(whole.mlp.gate_up_proj.weight[torch.cat([mlp, i + mlp])])
    down = whole.mlp.down_proj
    mine.mlp.down_proj = RowParallelLinear(down.weight[:, mlp].clone(), _copy(down.bias), group)


def _rows(heads: range, head_dim: int) -> torch.Tensor:
    return torch.arange(heads.start * head_dim, heads.stop * head_dim)


def _copy(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone()


# -- the CPU check: TP=world (gloo, one process per rank) against TP=1 -----------------------------
def _tiny(hf_overrides: dict) -> CausalLM:
    from executor.model.testing import tiny_config
    from executor.weights import random_weights

    model = CausalLM(tiny_config(**hf_overrides))
    random_weights(model, 7, std=0.2)
    return model


PROMPT = [3, 17, 101, 42, 7, 250, 9]


def engine_run(model: CausalLM) -> tuple[dict[int, list[int]], int]:
    """The check's offline engine run (torch attention, trace lengths): each request's tokens
    and the number of steps. Every rank schedules the same requests, all queued at the start,
    with the same deterministic scheduler, so every rank makes the same plans."""
    from executor.engine import Engine

    engine = Engine(model, _engine_config())
    records = engine.run_offline(_requests())
    return {k: list(v) for k, v in engine.outputs.items()}, len(records.step_end)


def _requests(arrival_gap: float = 0.0) -> list:
    from horizon.request import Request

    return [Request(i, i * arrival_gap, len(PROMPT) + i, 10 + i, 10 + i,
                    prompt_token_ids=tuple(PROMPT + list(range(20, 20 + i))))
            for i in range(6)]  # fmt: skip


def _engine_config(num_blocks: int = 96):  # noqa: ANN202
    from executor.engine import EngineConfig

    return EngineConfig(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=16,
                        max_num_seqs=4, max_model_len=128, attention_backend="torch",
                        stop="trace")  # fmt: skip


def online_run(part: CausalLM, rank: int) -> tuple[dict[int, list[int]], int, int]:
    """The check's online run: arrivals 2 ms apart on the wall clock, a pool of 12 blocks (the
    requests preempt each other), rank 0 scheduling and broadcasting each step, the other
    ranks following. Each request's tokens on this rank, the steps and the preemptions."""
    from executor.engine import Engine
    from executor.plan_broadcast import PlanBroadcast, follow, follower_sampling

    if rank != 0:
        return follow(Engine(part, _engine_config(12), sampling=follower_sampling).runner)
    engine = Engine(part, _engine_config(12))
    engine.runner = PlanBroadcast(engine.runner, engine.prompt_of, engine.sampling_of)
    try:
        records = engine.run_online(_requests(0.002))
    finally:
        engine.runner.close()
    outputs = {k: list(v) for k, v in engine.outputs.items()}
    return outputs, len(records.step_end), int(records.num_preemptions.sum())


def _rank_main(rank: int, world: int, init: str, hf_overrides: dict, n: int, out) -> None:  # noqa: ANN001
    from executor.model.testing import greedy_decode

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        part = shard(_tiny(hf_overrides), rank, world)
        tokens, logits = greedy_decode(part, PROMPT, n)
        # plain numbers: a tensor would travel as a file descriptor of this (exiting) process
        out.put((rank, tokens, logits.tolist(), engine_run(part), online_run(part, rank)))
    finally:
        dist.destroy_process_group()


def check(world: int = 2, hf_overrides: dict | None = None, n: int = 16) -> dict:
    """TP=``world`` on the tiny model on the CPU (gloo, spawned ranks) against TP=1: a dense
    greedy decode (every rank's tokens, the largest logit difference at its last step), an
    offline engine run over the paged KV cache (each rank's tokens per request and steps) and an
    online run with rank 0's plans broadcast (``online_run``: each rank's tokens and steps)."""
    import torch.multiprocessing as mp

    from executor.model.testing import greedy_decode

    overrides = hf_overrides or {}
    model = _tiny(overrides)
    ref, ref_logits = greedy_decode(model, PROMPT, n)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank_main, args=(r, world, init, overrides, n, q))
                 for r in range(world)]  # fmt: skip
        for p in procs:
            p.start()
        got = sorted((q.get(timeout=300) for _ in procs), key=lambda g: g[0])
        for p in procs:
            p.join(60)
    diff = max(float((torch.tensor(g[2]) - ref_logits).abs().max()) for g in got)
    return {
        "reference": ref,
        "ranks": [g[1] for g in got],
        "max_logit_diff": diff,
        "engine_reference": engine_run(model),
        "engine_ranks": [g[3] for g in got],
        "online_ranks": [g[4] for g in got],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m executor.tensor_parallel")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--kv-heads", type=int, default=None, help="the tiny model's (default 1)")
    args = p.parse_args(argv)
    kv = {} if args.kv_heads is None else {"num_key_value_heads": args.kv_heads}
    r = check(args.world, kv)
    same = all(t == r["reference"] for t in r["ranks"])
    engine = all(e == r["engine_reference"] for e in r["engine_ranks"])
    online = all(o[0] == r["engine_reference"][0] for o in r["online_ranks"])
    _, steps, preempted = r["online_ranks"][0]
    word = {True: "identical", False: "DIFFERENT"}
    print(f"TP={args.world} against TP=1: dense greedy tokens {word[same]} on every rank "
          f"(largest logit difference {r['max_logit_diff']:.2e}); paged engine run "
          f"{word[engine]} ({r['engine_reference'][1]} steps); online, rank 0's plans "
          f"broadcast: {word[online]} ({steps} steps, {preempted} preempted)")  # fmt: skip
    return 0 if same and engine and online else 1


if __name__ == "__main__":
    sys.exit(main())
