"""Drafting ahead (``PagedDraftModelDrafter.prefetch``, the runner's ``draft_ahead`` after each
verification): the drafts, the target's outputs and the drafter's state are those of a run
without it, while the drafts of requests that go on are taken from the launch ahead (CPU, tiny
model, fp32)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernel modules' import

from test_engine_offline import (  # noqa: E402
    OUTPUT_LENS,
    PROMPTS,
    dense_greedy,
    engine,
    make_model,
    make_requests,
    one_thread,  # noqa: F401
)

from executor.paged_draft import PagedDraftModelDrafter  # noqa: E402
from horizon.speculation import SpeculationConfig  # noqa: E402


@pytest.fixture(scope="module")
def models():
    target, draft = make_model(), make_model()
    torch.manual_seed(5)
    for p in draft.parameters():
        p.data.add_(torch.randn_like(p), alpha=0.01)  # drafts accepted and rejected
    return target, draft


def _run(models, ahead: bool, acceptance=None, on_device: bool = True):  # noqa: ANN001, ANN202
    """The tiny target's run with the perturbed draft model; every verification's request ids,
    histories' lengths and drafts, as the runner judged them."""
    target, draft = models
    spec = SpeculationConfig(policy="fixed", num_draft_tokens=3)
    e = engine(target, speculation=spec, num_blocks=40, acceptance=acceptance)
    d = PagedDraftModelDrafter(
        draft, max_seqs=4, max_len=128, draft_ahead=ahead, on_device=on_device
    )
    e.runner.drafter = d
    calls = []
    real = e.runner._verified

    def spy(ver, commit):  # noqa: ANN001, ANN202
        lens = [int(e.runner._len[row]) for row in ver.rows]
        calls.append(([r.request_id for r in ver.requests], lens, [x.tolist() for x in ver.drafts]))
        return real(ver, commit)

    e.runner._verified = spy
    rec = e.run_offline(make_requests())
    rec.check()
    return e, d, calls


@pytest.mark.parametrize("acceptance", [None, ("geometric", 0.7)])
def test_drafting_ahead_and_on_the_device_change_no_draft_and_no_output(models, acceptance):
    """Drafts read back before the verification is staged, left on the device, and launched
    ahead too, under the target's judgement and under stated acceptance: every verification
    (ids, histories' lengths, drafts) and every output is the same, and most verifying
    requests' drafts came from the launch ahead."""
    e0, d0, calls0 = _run(models, False, acceptance, on_device=False)
    e1, d1, calls1 = _run(models, False, acceptance)
    e2, d2, calls2 = _run(models, True, acceptance)
    assert calls2 == calls1 == calls0 and e2.outputs == e1.outputs == e0.outputs
    if acceptance is None:  # greedy: the target's own continuation, whatever the drafts
        assert e2.outputs == {
            i: dense_greedy(models[0], p, n) for i, (p, n) in enumerate(zip(PROMPTS, OUTPUT_LENS))
        }
    proposals = sum(sum(1 for x in drafts if x) for _, _, drafts in calls2)
    assert d0.num_ahead == d1.num_ahead == 0 and 0.5 * proposals < d2.num_ahead < proposals
    assert d2.num_steps < d1.num_steps + d2.num_ahead  # no proposal made twice over
    for d in (d0, d1, d2):
        assert not d._slots and not d._ready and d._ahead is None and not d._issued
        assert len(d._free) == 4


def test_a_launch_ahead_that_the_next_plan_does_not_match_is_proposed_afresh(models):
    """A history that changed after the launch (a rejected draft), another ``k``, a request
    forgotten while its drafts are in flight: each proposal equals a drafter's without the
    launch, and the forgotten request's slot is free again."""
    _, draft = models
    rng = np.random.default_rng(1)
    hs = [rng.integers(0, 512, n) for n in (30, 9, 17)]
    ahead = PagedDraftModelDrafter(draft, max_seqs=3, max_len=128)
    plain = PagedDraftModelDrafter(draft, max_seqs=3, max_len=128, draft_ahead=False)
    for d in (ahead, plain):
        d.propose_batch(hs, [3, 3, 3], [0, 1, 2])
    nxt = [np.concatenate([h, [int(rng.integers(0, 512))]]) for h in hs]
    ahead.prefetch(nxt, [3, 3, 3], [0, 1, 2])
    ahead.forget(2)
    plain.forget(2)
    assert 2 not in ahead._slots and len(ahead._free) == 1
    changed = [nxt[0], np.concatenate([nxt[1][:-1], [7]])]  # request 1's last token differs
    for ks in ([3, 3], [2, 3]):
        a = ahead.propose_batch(changed, ks, [0, 1])
        b = plain.propose_batch(changed, ks, [0, 1])
        assert [x.tolist() for x in a] == [x.tolist() for x in b]
        changed = [np.concatenate([h, x[:1]]) for h, x in zip(changed, a)]
        ahead.prefetch(changed, [3, 3], [0, 1])
    assert ahead.num_ahead == 2  # request 0 in the first round (1 changed), 1 in the second (0: k)
    for h, x in zip(changed[:1], ahead.propose_batch(changed, [3, 3], [0, 1])):
        assert x.tolist() == dense_greedy(draft, h.tolist(), 3)


def test_a_slot_taken_back_while_drafts_are_in_flight_is_not_handed_back(models):
    """Two slots: drafts launched ahead for requests 0 and 1, then a step of request 2 alone
    on the device takes back a slot of theirs; the drafter stays consistent after every call
    and proposes what a drafter without launches ahead proposes."""
    _, draft = models
    rng = np.random.default_rng(2)
    hs = {i: rng.integers(0, 512, n) for i, n in enumerate((12, 20, 16))}
    ahead = PagedDraftModelDrafter(draft, max_seqs=2, max_len=64)
    plain = PagedDraftModelDrafter(draft, max_seqs=2, max_len=64, draft_ahead=False)
    for d in (ahead, plain):
        d.propose_batch([hs[0], hs[1]], [2, 2], [0, 1])
    ahead.prefetch([hs[0], hs[1]], [2, 2], [0, 1])
    ahead.check_integrity()
    for ids in ((2,), (0, 2), (1, 0)):
        got = ahead.propose_on_device([hs[i] for i in ids], [2] * len(ids), list(ids))
        ahead.check_integrity()
        want = plain.propose_batch([hs[i] for i in ids], [2] * len(ids), list(ids))
        assert got.T[: len(ids), :2].tolist() == [w.tolist() for w in want]
    ahead.prefetch([hs[1]], [2], [1])
    ahead.check_integrity()
    assert len(ahead._slots) == 2 and not ahead._free
