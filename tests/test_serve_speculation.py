"""Speculative decoding behind the server (n-gram drafts, fixed k): the same greedy text, finish
reasons and token counts as the plain server for every stopping rule (max_tokens, end of
sequence with and without min_tokens, a stop string), drafts proposed and verified, the
records counting what was streamed."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from serve_fixtures import served, settle, tiny_model
from test_engine_offline import dense_greedy

from executor.drafter import Drafter
from horizon.speculation import SpeculationConfig

PROMPTS = ["abcabcabcabcabc", "Hello hello hello", "xyz", "one two one two one two"]
CASES = [  # request bodies beside the prompt
    {"max_tokens": 40, "ignore_eos": True},
    {"max_tokens": 60},
    {"max_tokens": 60, "min_tokens": 30},
    {"max_tokens": 60, "ignore_eos": True, "stop": ["c"]},
]


class NearOracleDrafter(Drafter):
    """The served model's own greedy continuation, every third draft position spoiled: most
    drafts accepted, some rejected, and the stopping rules land inside verifications."""

    def __init__(self) -> None:
        self.model = tiny_model()  # the served weights (same seed)

    def propose(self, tokens: np.ndarray, k: int) -> np.ndarray:
        drafts = np.array(dense_greedy(self.model, tokens.tolist(), k), dtype=np.int64)
        spoiled = (len(tokens) + np.arange(k)) % 3 == 0
        drafts[spoiled] = (drafts[spoiled] + 1) % self.model.config.vocab_size
        return drafts


def completions(speculation: SpeculationConfig | None, **kw) -> tuple[list[tuple], object]:
    out = []
    with served(speculation=speculation, **kw) as (server, http):
        for prompt in PROMPTS:
            for case in CASES:
                body = {"model": "tiny", "prompt": prompt, "temperature": 0, **case}
                r = httpx.post(http.url + "/v1/completions", json=body, timeout=60).json()
                choice = r["choices"][0]
                out.append((choice["text"], choice["finish_reason"],
                            r["usage"]["completion_tokens"]))  # fmt: skip
        settle(server)
    return out, server


@pytest.fixture(scope="module")
def plain():
    return completions(None)[0]


@pytest.mark.parametrize("drafter", ["ngram", "test_serve_speculation:NearOracleDrafter"])
def test_speculation_serves_the_plain_servers_text(plain, drafter):
    spec = SpeculationConfig(policy="fixed", num_draft_tokens=3)
    got, server = completions(spec, drafter=drafter)
    assert got == plain
    runner = server.live.engine.runner
    assert runner.num_proposed > 0  # drafts were proposed and verified
    if drafter != "ngram":  # most accepted, some not
        assert 0.5 * runner.num_proposed < runner.num_accepted < runner.num_proposed
    rec = server.live.records()
    assert sorted(rec.num_output_tokens.tolist()) == sorted(n for _, _, n in plain)
