"""Verification steps as expanded decode steps (``EngineConfig.verify_as_decode``, CPU, tiny
model, fp32): a step of decodes and verifications only runs each verification's ``k + 1`` query
tokens as decode rows; it gives the tokens and the verification logits of the mixed path (the
switch off), on the torch backend and through the Triton kernels (interpreter), padded as its
graphs are; steps with prefill chunks keep the mixed path."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernel modules' import

from test_engine_offline import (  # noqa: E402
    PROMPTS,
    dense_greedy,
    make_model,
    one_thread,  # noqa: F401
)
from test_engine_offline import engine as _engine  # noqa: E402
from test_engine_speculation import OracleDrafter, _spec  # noqa: E402

from executor.engine import EngineConfig  # noqa: E402
from executor.sampling import SamplingParams  # noqa: E402
from horizon.request import Request  # noqa: E402

# outputs long enough for steady verification steps of several requests, ending apart
OUTPUTS = [21, 30, 12, 26, 17, 9, 24, 14]


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def dense(model):
    return {i: dense_greedy(model, p, n) for i, (p, n) in enumerate(zip(PROMPTS, OUTPUTS))}


def engine(model, **kw):  # noqa: ANN001, ANN003, ANN201
    """``test_engine_offline``'s engine (4 sequences, 16 tokens a step) with a pool of 30
    blocks of 4: short enough that some requests get no draft block (plain decodes beside
    verifications) and one is preempted."""
    return _engine(model, **{"num_blocks": 30, "max_model_len": 64, **kw})


def make_requests(n: int) -> list[Request]:
    return [
        Request(i, 0.0, len(p), o, o, prompt_token_ids=tuple(p))
        for i, (p, o) in enumerate(zip(PROMPTS[:n], OUTPUTS[:n]))
    ]


def _spied_run(e, dense, n_req: int, seed: int = 0) -> dict:  # noqa: ANN001
    """One offline run of the first ``n_req`` requests with an oracle drafter (rejections
    included); records each verification step's shape (``_padding``'s, with whether the plan
    had chunks, its decodes and query rows) and the logits ``_judge`` got, keyed by the
    verifying requests, their first positions and drafts."""
    r = e.runner
    r.drafter = OracleDrafter(PROMPTS, dense.values(), noise=0.5, seed=seed)
    shapes, judged = [], []
    padding, judge = r._padding, r._judge

    def spy_padding(plan, nd, ver=None):  # noqa: ANN001, ANN202
        shape = padding(plan, nd, ver)
        if ver is not None:
            shapes.append((bool(plan.prefills), nd, ver.n, shape))
        return shape

    def spy_judge(ver, vlogits):  # noqa: ANN001, ANN202
        reqs = zip(ver.requests, ver.starts, ver.drafts)
        key = [(q.request_id, c, tuple(d.tolist())) for q, c, d in reqs]
        judged.append((key, vlogits.clone()))
        return judge(ver, vlogits)

    r._padding, r._judge = spy_padding, spy_judge
    try:
        e.run_offline(make_requests(n_req))
    finally:
        del r._padding, r._judge
    return {"outputs": dict(e.outputs), "shapes": shapes, "judged": judged,
            "paths": dict(r.num_verify_steps)}  # fmt: skip


def _check_paths(on: dict, off: dict) -> None:
    """On: every verification step without chunks expanded, with them mixed; some expanded
    steps carry plain decodes and several verifying requests. Off: none expanded."""
    assert on["paths"]["decode"] > 0 and off["paths"]["decode"] == 0
    assert off["paths"]["mixed"] == len(off["shapes"])
    for chunks, nd, n, (bucket, mixed, expanded) in on["shapes"]:
        assert bucket == 0 and (expanded == 0 or mixed == 0)
        assert (expanded == 0) == chunks, (chunks, nd, n, expanded)
        assert expanded == 0 or expanded >= nd + n
    exp = [(nd, n) for chunks, nd, n, _ in on["shapes"] if not chunks]
    assert on["paths"] == {"decode": len(exp), "mixed": len(on["shapes"]) - len(exp)}
    assert any(nd > 0 for nd, _ in exp), "no expanded step had plain decodes"
    assert any(n > 4 for _, n in exp), "no expanded step had several verifications' rows"
    assert all(expanded == 0 for *_, (_, _, expanded) in off["shapes"])


def _check_same(on: dict, off: dict, dense: dict, atol: float) -> None:
    """Same tokens (the dense greedy ones), the same verifications, the same logits."""
    assert on["outputs"] == off["outputs"] == {i: dense[i] for i in on["outputs"]}
    assert [k for k, _ in on["judged"]] == [k for k, _ in off["judged"]]
    for (_, a), (_, b) in zip(on["judged"], off["judged"]):
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("pad", [False, True])
def test_expanded_verification_equals_the_mixed_path(model, dense, pad):
    """Torch backend; ``pad``: padded as the graphs are (verification rows to the row buckets,
    mixed steps to token buckets). One engine, the switch flipped in its config between runs."""
    e = engine(model, speculation=_spec(3))
    e.runner.pad_decodes = e.runner.pad_mixed = pad
    on = _spied_run(e, dense, len(PROMPTS))
    e.config = dataclasses.replace(e.config, verify_as_decode=False)
    off = _spied_run(e, dense, len(PROMPTS))
    _check_paths(on, off)
    _check_same(on, off, dense, atol=1e-5)
    if pad:  # some expanded step had padding rows
        assert any(x[3][2] > x[1] + x[2] for x in on["shapes"] if not x[0])
    assert e.runner.verify_buckets[0] == 1 and e.runner.verify_buckets[-1] == 16


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter check (GPU: spec_bench)"
)
def test_expanded_verification_through_the_triton_kernels(model, dense):
    """The Triton decode kernel and the fused RoPE/KV-store kernel (interpreter) on expanded
    rows against the prefill kernel on the same verifications, padded as the graphs are."""
    pytest.importorskip("triton")
    runs = {}
    for on in (True, False):
        e = engine(model, attention_backend="triton", cuda_graphs=False, speculation=_spec(3),
                   verify_as_decode=on)  # fmt: skip
        assert e.runner.fused
        e.runner.pad_decodes = e.runner.pad_mixed = True
        runs[on] = _spied_run(e, dense, 3)
    _check_paths(runs[True], runs[False])
    _check_same(runs[True], runs[False], dense, atol=1e-4)


def test_sampled_verifications_on_either_path_give_the_same_tokens(model, dense):
    """Temperature 0.15 (rejection sampling, seeded per request): both paths draw the same
    tokens, under KV pressure (preemption and recompute between verifications)."""
    outs = []
    for on in (True, False):
        e = engine(model, speculation=_spec(4), sampling=SamplingParams(temperature=0.15),
                   verify_as_decode=on)  # fmt: skip
        e.runner.drafter = OracleDrafter(PROMPTS, dense.values(), noise=0.3, seed=5)
        rec = e.run_offline(make_requests(len(PROMPTS)))
        outs.append(e.outputs)
        assert rec.num_preemptions.sum() > 0 and e.scheduler.num_accepted > 0
        assert (e.runner.num_verify_steps["decode"] > 0) == on
    assert outs[0] == outs[1]


def test_verify_as_decode_must_be_a_bool():
    with pytest.raises(ValueError, match="EngineConfig.verify_as_decode"):
        EngineConfig(num_blocks=8, verify_as_decode="off")
    assert EngineConfig(num_blocks=8).verify_as_decode is True


def test_spec_bench_switch_takes_the_path_it_names(tmp_path):
    """``python -m executor.spec_bench --verify-as-decode on|off`` (the stated grid and the
    n-gram bench): each row counts its verification steps by path, all but those with chunks
    expanded when on, none when off; the stated draws give the same steps and acceptance."""
    import json

    from executor.spec_bench import main

    stated = ["--model", "tiny", "--device", "cpu", "--drafter", "ngram", "--acceptance", "0.7"]
    stated += ["--k", "2", "--batch", "1,2", "--prompt-len", "20", "--out-base", "6"]
    stated += ["--out-span", "6"]
    plain = ["--model", "tiny", "--device", "cpu", "--batch", "2", "--k", "2", "--max-new", "8"]
    plain += ["--repeats", "1"]
    res = {}
    for name, args in (("stated", stated), ("ngram", plain)):
        for mode in ("on", "off"):
            out = tmp_path / f"{name}_{mode}.json"
            assert main([*args, "--verify-as-decode", mode, "--json-out", str(out)]) == 0
            res[name, mode] = json.loads(out.read_text())
            assert res[name, mode]["verify_as_decode"] is (mode == "on")
    for name in ("stated", "ngram"):
        on, off = (res[name, m]["rows"] for m in ("on", "off"))
        spec_on, spec_off = ([r for r in rows if r["k"]] for rows in (on, off))
        assert spec_on and len(spec_on) == len(spec_off)
        for a, b in zip(spec_on, spec_off):
            assert a["verify_steps"]["decode"] > 0 and b["verify_steps"]["decode"] == 0
            assert sum(a["verify_steps"].values()) == sum(b["verify_steps"].values())
            assert a["steps"] == b["steps"]
    for a, b in zip(res["stated", "on"]["rows"], res["stated", "off"]["rows"]):
        assert a["accepted_per_draft"] == b["accepted_per_draft"]
    assert all(r["identical"] for m in ("on", "off") for r in res["ngram", m]["rows"])
    assert "verify as decode" in res["stated", "on"]["title"]
    assert "mixed path" in res["stated", "off"]["title"]
