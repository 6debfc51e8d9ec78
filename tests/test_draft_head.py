"""The EAGLE-3-layout draft head (executor.draft_head): its parameters are the layout's, the
paged drafter's proposals with it equal a dense step-by-step reference (fresh histories and
after accepted drafts), the Triton kernels (interpreter) propose what the reference ops do,
and spec_bench's stated grid runs it."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernel modules' import

from executor.draft_head import DraftHead  # noqa: E402
from executor.model import DenseAttention, DenseKVCache, ModelConfig  # noqa: E402
from executor.model.testing import tiny_config  # noqa: E402
from executor.paged_draft import PagedDraftModelDrafter  # noqa: E402
from executor.weights import random_weights  # noqa: E402


def make_head(draft_vocab: int = 200, seed: int = 5) -> DraftHead:
    head = DraftHead(tiny_config(), draft_vocab)
    random_weights(head, seed, std=0.2)
    with torch.no_grad():  # a draft vocabulary that is not the first ids of the target's
        head.d2t.copy_(
            torch.randperm(512, generator=torch.Generator().manual_seed(1))[:draft_vocab]
        )
    return head.eval()


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Reference:
    """One sequence through the EAGLE-3 layout written out here from the head's parameters,
    dense keys and values, as the paged drafter runs it: tokens fed after a verification
    take the stand-in target's features (fc of zeros: zeros), drafts fed while drafting the
    head's previous output before its final norm."""

    def __init__(self, head: DraftHead) -> None:
        self.p = {n: t.detach() for n, t in head.named_parameters()}
        self.d2t, self.c = head.d2t, head.config
        self.keys = self.values = torch.zeros(0)
        self.held: list[int] = []

    def feed(self, tokens: list[int], features: torch.Tensor) -> tuple[int, torch.Tensor]:
        """Feed ``tokens`` with their ``features``: the draft after the last, and its output."""
        p, c, t, n = self.p, self.c, len(tokens), len(self.held)
        e = p["embed_tokens.weight"][torch.tensor(tokens)]
        f = _norm(features, p["hidden_norm.weight"])
        x = torch.cat([_norm(e, p["input_layernorm.weight"]), f], -1)
        qkv = x @ p["qkv_proj.weight"].T + p["qkv_proj.bias"]
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], -1)
        pos = torch.arange(n, n + t)
        q = _rope(q.reshape(t, c.num_heads, c.head_dim), pos, c.rope_theta)
        k = _rope(k.reshape(t, c.num_kv_heads, c.head_dim), pos, c.rope_theta)
        self.keys = torch.cat([self.keys[:n], k]) if n else k
        v = v.reshape(t, c.num_kv_heads, c.head_dim)
        self.values = torch.cat([self.values[:n], v]) if n else v
        rep = c.num_heads // c.num_kv_heads
        kk, vv = self.keys.repeat_interleave(rep, 1), self.values.repeat_interleave(rep, 1)
        s = torch.einsum("thd,shd->hts", q, kk) * c.attention_scale
        s = s.masked_fill(torch.arange(n + t)[None, None, :] > pos[None, :, None], float("-inf"))
        o = torch.einsum("hts,shd->thd", s.softmax(-1), vv).reshape(t, c.q_size)
        h = features + o @ p["o_proj.weight"].T
        up = _norm(h, p["post_attention_layernorm.weight"]) @ p["mlp.gate_up_proj.weight"].T
        gate, up = up.chunk(2, -1)
        h = h + (torch.nn.functional.silu(gate) * up) @ p["mlp.down_proj.weight"].T
        logits = _norm(h[-1], p["norm.weight"]) @ p["lm_head.weight"].T
        self.held += tokens
        return int(self.d2t[logits.argmax()]), h[-1:]

    def keep(self, history: list[int]) -> int:
        """Tokens of ``history`` whose KV this holds (the last excluded)."""
        n = min(len(self.held), len(history) - 1)
        return next((i for i in range(n) if self.held[i] != history[i]), n)

    @torch.no_grad()
    def propose(self, history: list[int], k: int, start: int) -> list[int]:
        """Back to ``start`` tokens, the rest of ``history`` fed from the target, ``k`` drafts."""
        self.held = self.held[:start]
        rest = history[start:]
        draft, out = self.feed(rest, torch.zeros(len(rest), self.c.hidden_size))
        drafts = [draft]
        while len(drafts) < k:
            draft, out = self.feed([draft], out)
            drafts.append(draft)
        return drafts


def test_the_heads_parameters_are_eagle3s_layout_on_the_7b():
    """Qwen2.5-7B's width: one layer whose QKV reads two hidden states, the fusion layer from
    three, a 32,000-row head, the target's embedding; KV for one layer."""
    head = DraftHead(ModelConfig.for_preset("qwen2.5-7b"), device="meta")
    h, i, q, kv = 3584, 18944, 3584, 512
    want = {
        "embed_tokens.weight": 152064 * h,
        "fc.weight": 3 * h * h,
        "qkv_proj.weight": 2 * h * (q + 2 * kv),
        "qkv_proj.bias": q + 2 * kv,
        "o_proj.weight": q * h,
        "mlp.gate_up_proj.weight": 2 * i * h,
        "mlp.down_proj.weight": i * h,
        "lm_head.weight": 32000 * h,
    }
    got = {n: p.numel() for n, p in head.named_parameters() if not n.endswith("norm.weight")}
    assert got == want
    assert sum(1 for n, _ in head.named_parameters() if n.endswith("norm.weight")) == 4
    assert head.config.num_layers == 1 and head.config.num_kv_heads == 4
    with pytest.raises(ValueError, match="draft_vocab"):
        DraftHead(ModelConfig.for_preset("qwen2.5-7b"), 200_000, device="meta")


@torch.no_grad()
def test_features_of_more_rows_than_the_graph_buffer_chain_too():
    """A forward of more tokens than the fixed feature buffer (an eager prefill), then one of
    as many fed from its outputs: the second reads the first's outputs, as the reference
    writes them out (features of the next forward = the last one's output rows)."""
    from executor.draft_head import GRAPH_TOKENS

    head, t = make_head(), GRAPH_TOKENS + 3
    ids = torch.arange(t) % 512

    def forward():  # each token its own one-token sequence: no attention across rows
        att = DenseAttention(
            [1] * t, [DenseKVCache(1) for _ in range(t)], head.config.attention_scale
        )
        return head(ids, torch.zeros_like(ids), att)

    head.begin_proposal(t)
    first = forward()
    head.greedy_tokens(first)
    out1 = head._out.clone()
    second = forward()
    ref = Reference(head)
    for j in (0, t - 1):  # rows at both ends of the buffer: the second forward's features
        ref.held, want = [], ref.feed([int(ids[j])], out1[j : j + 1])[1]
        torch.testing.assert_close(head._out[j : j + 1], want, atol=1e-5, rtol=1e-5)
    assert not torch.equal(second, first)


def test_paged_drafter_with_the_head_proposes_the_dense_references_drafts():
    """Three requests over rounds of proposals, accepting some drafts (all, at times) then a
    target token: each round's drafts are the reference's. Accepted drafts keep the KV they
    were drafted with; a round where some request has two tokens to catch up feeds every
    request's last two from the target (the drafter's two-token first forward)."""
    head = make_head()
    rng = np.random.default_rng(0)
    hs = [rng.integers(0, 512, n) for n in (9, 14, 5)]
    d = PagedDraftModelDrafter(head, max_seqs=3, max_len=96, block_size=4)
    refs = [Reference(head) for _ in hs]
    seen, pairs = set(), 0
    for rnd in range(6):
        ks = [3, 2 + rnd % 2, 4]
        out = d.propose_batch(hs, ks, [0, 1, 2])
        keeps = [ref.keep(h.tolist()) for ref, h in zip(refs, hs)]
        pair = max(len(h) - n for h, n in zip(hs, keeps)) > 1
        pairs += pair
        starts = [min(n, len(h) - 2) if pair else n for h, n in zip(hs, keeps)]
        want = [ref.propose(h.tolist(), k, s) for ref, h, k, s in zip(refs, hs, ks, starts)]
        assert [o.tolist() for o in out] == want
        assert all(set(o.tolist()) <= set(head.d2t.tolist()) for o in out)
        seen |= {tuple(o.tolist()) for o in out}
        keep = [(rnd + j) % (ks[j] + 1) for j in range(3)]  # all accepted at times
        hs = [np.concatenate([h, o[:a], [int(rng.integers(0, 512))]]) for h, o, a in
              zip(hs, out, keep)]  # fmt: skip
    assert len(seen) > 3  # not one constant proposal
    assert d.num_two_token_steps == pairs and 0 < pairs < 6 and d.num_prefill_tokens > 0


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter check (GPU: spec_bench)"
)
def test_the_heads_triton_kernels_propose_what_its_reference_ops_do():
    """The fused kernels (interpreter) in the head's prefill, two-token and decode forwards:
    the same drafts as the reference ops, round after round."""
    pytest.importorskip("triton")
    head = make_head()
    rng = np.random.default_rng(2)
    hs = [rng.integers(0, 512, n) for n in (11, 6)]
    ref = PagedDraftModelDrafter(head, max_seqs=2, max_len=64, backend="torch")
    tri = PagedDraftModelDrafter(head, max_seqs=2, max_len=64, backend="triton", cuda_graphs=False)
    for rnd in range(3):
        want = ref.propose_batch(hs, [3, 2], [0, 1])
        got = tri.propose_batch(hs, [3, 2], [0, 1])
        assert [g.tolist() for g in got] == [w.tolist() for w in want]
        hs = [np.concatenate([h, w[: rnd + 1], [7]]) for h, w in zip(hs, want)]
    assert tri.num_two_token_steps == ref.num_two_token_steps > 0


def test_spec_bench_stated_grid_runs_the_head(tmp_path):
    """python -m executor.spec_bench --model tiny --drafter eagle3 --acceptance ...: every
    speculative row drafted by the head; the draft cost has no engine step to compare with."""
    from executor.spec_bench import main

    out = tmp_path / "stated.json"
    args = ["--model", "tiny", "--device", "cpu", "--drafter", "eagle3", "--batch", "1"]
    args += ["--acceptance", "0.7", "--k", "2", "--prompt-len", "20", "--out-base", "4"]
    args += ["--out-span", "6", "--repeats", "1", "--draft-cost", "1", "--json-out", str(out)]
    assert main(args) == 0
    res = json.loads(out.read_text())
    assert res["drafter"].startswith("EAGLE-3-layout draft head") and "512-token" in res["drafter"]
    spec = [r for r in res["rows"] if r["k"]]
    assert len(spec) == 1 and spec[0]["draft_steps"] > 0 and spec[0]["accepted_per_draft"] > 0
    cost = res["draft_cost"][0]
    assert cost["engine_decode_ms"] is None and cost["paged_ms_per_position"] > 0
    assert "dense_ms_per_position" not in cost


def test_the_registered_eagle3_head_drafter_runs_in_the_engine():
    """``EngineConfig(drafter="eagle3_head")`` on the tiny target under stated acceptance: the
    head drafts every verification and every request ends with its trace's length; a target
    that is neither a preset name nor a config is refused, naming the field."""
    from test_engine_offline import OUTPUT_LENS, engine, make_model, make_requests

    from executor.drafter import make_drafter
    from horizon.speculation import SpeculationConfig

    model = make_model()
    options = (("target", model.config), ("max_seqs", 4), ("max_len", 128))
    options += (("dtype", "float32"), ("device", "cpu"))
    spec = SpeculationConfig(policy="fixed", num_draft_tokens=2)
    e = engine(model, speculation=spec, acceptance=("geometric", 0.7), drafter="eagle3_head",
               drafter_options=options)  # fmt: skip
    rec = e.run_offline(make_requests())
    rec.check()
    assert isinstance(e.runner.drafter.model, DraftHead)
    assert e.runner.drafter.model.draft_vocab == 512  # the tiny target's, under 32,000
    assert e.runner.num_proposed > 0 and e.runner.drafter.num_steps > 0
    assert [len(e.outputs[i]) for i in range(len(OUTPUT_LENS))] == list(OUTPUT_LENS)
    with pytest.raises(ValueError, match="eagle3_head.target"):
        make_drafter("eagle3_head", target=42, max_seqs=1, max_len=8, device="cpu")
