"""The runner's other paths on the CPU: decode batches padded to graph buckets, the Triton
kernels (interpreter), teacher-forced logits, the profiler's synthetic steps."""

from __future__ import annotations

import csv
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernel modules' import

from test_engine_offline import (  # noqa: E402
    PROMPTS,
    dense_greedy,
    engine,
    make_model,
    make_requests,
    one_thread,  # noqa: F401
)

from executor.check import teacher_forced_argmax  # noqa: E402
from executor.kernels import allocate_kv_cache  # noqa: E402
from executor.model import DenseKVCache  # noqa: E402
from executor.model.testing import forward_prompts  # noqa: E402
from executor.profiler import COLUMNS, Shape, StepProfiler, grid, write_csv  # noqa: E402
from executor.runner import ModelRunner, mixed_token_buckets  # noqa: E402

OUTPUTS = [5, 4, 6, 3, 5, 2, 4, 3]


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def dense(model):
    return {i: dense_greedy(model, p, n) for i, (p, n) in enumerate(zip(PROMPTS, OUTPUTS))}


def test_decodes_padded_to_buckets_give_the_same_tokens(model, dense):
    """What a CUDA graph replays: a decode batch padded with slot -1 / context 0 rows."""
    e = engine(model, graph_batch_sizes=(1, 3))  # buckets 1, 3, 4 (= max_num_seqs)
    e.runner.pad_decodes = True
    assert e.runner.graph_batch_sizes == (1, 3, 4)
    rec = e.run_offline(make_requests(outputs=OUTPUTS))
    assert e.outputs == dense
    assert 2 in set(rec.decode_tokens[rec.prefill_tokens == 0])  # padded to 3


def test_mixed_steps_padded_as_their_graphs_give_the_same_tokens(model, dense):
    """What a mixed-step graph replays: tokens padded to a bucket (slot -1, in no sequence) and
    sequences padded to max_num_seqs (empty, context 0)."""
    e = engine(model)
    e.runner.pad_mixed = True
    e.runner.pad_decodes = True
    rec = e.run_offline(make_requests(outputs=OUTPUTS))
    assert e.outputs == dense
    mixed = rec.prefill_tokens > 0
    sizes = rec.prefill_tokens[mixed] + rec.decode_tokens[mixed]
    assert mixed.sum() >= 2 and not set(sizes) <= set(e.runner.mixed_token_buckets)  # padded


def test_mixed_token_buckets_cover_the_budget():
    for budget in (16, 64, 512, 2048, 3000):
        b = mixed_token_buckets(budget)
        assert b[-1] == budget and list(b) == sorted(set(b))
        gaps = [hi / lo for lo, hi in zip(b, b[1:]) if lo >= 256]
        assert all(g <= 1.26 for g in gaps)  # padding a large step costs at most a quarter


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter check (GPU: executor.check)"
)
def test_triton_kernels_through_the_interpreter(model, dense):
    pytest.importorskip("triton")
    e = engine(model, attention_backend="triton", cuda_graphs=False)
    e.runner.pad_decodes = True
    e.runner.pad_mixed = True
    e.run_offline(make_requests(PROMPTS[:4], OUTPUTS[:4]))
    assert e.outputs == {i: dense[i] for i in range(4)}


@pytest.mark.parametrize("pad", [False, True])
def test_teacher_forced_logits_equal_dense(model, pad):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (5, 30, 17)]
    conts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (6, 3, 9)]
    c = model.config
    kv = allocate_kv_cache(c.num_layers, 64, 4, c.num_kv_heads, c.head_dim, torch.float32, "cpu")
    runner = ModelRunner(model, kv, 8, 64, 128, pad_decodes=pad)
    got = teacher_forced_argmax(runner, prompts, conts, chunk=7, keep_logits=True)
    assert runner.num_sequences == 0
    for p, cont, logits in zip(prompts, conts, got):
        want = forward_prompts(model, [p + cont], [DenseKVCache(c.num_layers)])
        torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)


def test_profiler_steps_have_the_schedulers_shape_fields(model, tmp_path):
    c = model.config
    kv = allocate_kv_cache(c.num_layers, 80, 4, c.num_kv_heads, c.head_dim, torch.float32, "cpu")
    runner = ModelRunner(model, kv, 8, 64, 128)
    prof = StepProfiler(runner)
    shapes = [
        Shape("decode", (9, 20)),
        Shape("prefill", (), ((0, 16), (12, 5))),
        Shape("mixed", (33,), ((4, 30),)),
    ]
    rows = [prof.measure(s, repeats=2, warmup=1) for s in shapes]
    assert runner.num_sequences == 0
    assert rows[0]["num_decodes"] == 2 and rows[0]["decode_context_tokens"] == 8 + 19
    assert rows[1]["num_prefill_tokens"] == 21 and rows[1]["num_prefills"] == 2
    assert rows[1]["prefill_context_tokens"] == 16 + 17
    assert rows[1]["prefill_attention_pairs"] == 16 * 17 // 2 + 5 * 12 + 5 * 6 // 2
    assert rows[2]["kind"] == "mixed" and rows[2]["num_decodes"] == 1
    assert all(r["step_s"] > 0 for r in rows)
    write_csv(rows, tmp_path / "cal.csv")
    with open(tmp_path / "cal.csv") as f:
        back = list(csv.DictReader(f))
    assert tuple(back[0]) == COLUMNS and len(back) == 3
    with pytest.raises(ValueError, match="KV blocks"):
        prof.build(Shape("decode", (128,) * 4))


def test_duty_cycle_times_full_steps_between_decode_steps(model):
    from executor.duty_cycle import run

    c = model.config
    kv = allocate_kv_cache(c.num_layers, 40, 4, c.num_kv_heads, c.head_dim, torch.float32, "cpu")
    runner = ModelRunner(model, kv, 8, 64, 128)
    full, decode = Shape("prefill", (), ((0, 30),)), Shape("decode", (9, 20, 33))
    rows = run(StepProfiler(runner), full, decode, (0, 2), rounds=4)
    assert runner.num_sequences == 0  # both shapes' requests released
    assert [r["gap"] for r in rows] == [0, 2]
    assert [r["full_steps"] for r in rows] == [2, 2]  # the first two rounds of a gap dropped
    assert [r["decode_steps"] for r in rows] == [0, 8]
    assert rows[0]["decode_ms"] is None and rows[1]["decode_ms"] > 0
    assert all(r["full_ms"] > 0 and r["wall_end"] >= r["wall_start"] for r in rows)
    with pytest.raises(ValueError, match="KV blocks"):  # 8 + 64 blocks: the cache is 40
        run(StepProfiler(runner), full, Shape("decode", (64,) * 4), (1,), rounds=1)
    assert runner.num_sequences == 0


def test_default_grid_covers_the_plan_space():
    shapes = grid(2048, 256)
    kinds = {s.kind for s in shapes}
    assert kinds == {"decode", "prefill", "mixed"}
    assert max(len(s.decode_contexts) for s in shapes) == 256
    assert max(sum(n for _, n in s.chunks) + len(s.decode_contexts) for s in shapes) <= 2048
    assert all(len(s.decode_contexts) + len(s.chunks) <= 256 for s in shapes)
