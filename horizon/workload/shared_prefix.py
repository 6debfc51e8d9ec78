"""Prefix-heavy workload: K groups of users, each group sharing one system prompt.

The shape of llm-d's prefix-cache benchmarks (inference-perf ``shared_prefix``): every request's
prompt is its group's system prompt followed by a question of its own::

    prompt(r) = prefix[group(r)] + question(r)

Group prefixes are seeded random token ids (``prefix_tokens`` each); questions are distinct
across requests, either seeded random ids (``question_tokens`` an int) or the first user turn of
distinct ShareGPT conversations (raw ids, no chat template, so the shared part is exactly the
prefix). Requests of one group therefore share exactly ``prefix_tokens`` leading tokens; requests
of different groups share none (up to chance on random ids).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from horizon.request import SLO, Request
from horizon.workload import arrivals
from horizon.workload.field_checks import (
    check_choice,
    check_int,
    check_number,
    check_slo,
)
from horizon.workload.tokenized import TokenizedCorpus
from horizon.workload.turns import answered_turns

GROUP_POPULARITIES = ("uniform", "zipf")
SHARED_PREFIX_ARRIVALS = ("poisson", "gamma")


@dataclass(frozen=True)
class SharedPrefixConfig:
    """Recipe of a shared-prefix workload; ``build_shared_prefix`` turns it into requests.

    Fields:
        num_requests: how many requests, >= 1.
        num_groups: K, the number of distinct system prompts, >= 1.
        prefix_tokens: length of each group's system prompt, >= 1.
        question_tokens: None = each request's question is the first user turn of a distinct
            ShareGPT conversation (needs a corpus); an int >= 1 = random ids of that length.
        max_question_tokens: corpus questions longer than this are skipped (None = no limit);
            unused when ``question_tokens`` is an int.
        output_tokens: None = the corpus reply's length, capped at ``max_output_tokens`` (needs
            a corpus); an int in 1..max_output_tokens = every request's fixed output length.
        max_output_tokens: every request's output limit, >= 1.
        group_popularity: ``"uniform"`` (each request picks a group uniformly) or ``"zipf"``
            (group k with probability proportional to ``1 / (k + 1) ** zipf_s``; group 0 is the
            most popular).
        zipf_s: the Zipf exponent, > 0.
        rate, arrival, burstiness: mean requests/s of ``"poisson"`` or ``"gamma"`` arrivals
            (``horizon.workload.arrivals``).
        seed: fixes prefixes, groups, questions, sampled conversations and arrival times.
        vocab_size: random token ids are drawn from ``0 .. vocab_size - 1`` (the default stays
            below Qwen's special tokens).
        slo_ttft, slo_itl: per-request SLO in seconds (both or neither).
    """

    num_requests: int = 1000
    num_groups: int = 16
    prefix_tokens: int = 2048
    question_tokens: int | None = None
    max_question_tokens: int | None = 1024
    output_tokens: int | None = None
    max_output_tokens: int = 2048
    group_popularity: str = "uniform"
    zipf_s: float = 1.0
    rate: float = 1.0
    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    vocab_size: int = 151_000
    slo_ttft: float | None = None
    slo_itl: float | None = None

    def __post_init__(self) -> None:
        for name in ("num_requests", "num_groups", "prefix_tokens", "max_output_tokens"):
            check_int(self, name, minimum=1)
        for name in ("question_tokens", "max_question_tokens", "output_tokens"):
            check_int(self, name, minimum=1, optional=True)
        check_int(self, "seed", minimum=0)
        check_int(self, "vocab_size", minimum=2)
        check_choice(self, "group_popularity", GROUP_POPULARITIES)
        check_choice(self, "arrival", SHARED_PREFIX_ARRIVALS)
        for name in ("zipf_s", "rate", "burstiness"):
            check_number(self, name)
        check_slo(self)
        if self.output_tokens is not None and self.output_tokens > self.max_output_tokens:
            raise ValueError(
                f"SharedPrefixConfig.output_tokens ({self.output_tokens}) exceeds "
                f"max_output_tokens ({self.max_output_tokens})"
            )
        q = self.question_tokens
        if q is not None and self.vocab_size ** min(q, 64) < self.num_requests:
            raise ValueError(
                f"SharedPrefixConfig.question_tokens={q} with vocab_size={self.vocab_size} "
                f"cannot give {self.num_requests} distinct questions"
            )

    @property
    def needs_corpus(self) -> bool:
        return self.question_tokens is None or self.output_tokens is None


def build_shared_prefix(
    config: SharedPrefixConfig, tokenized: TokenizedCorpus | None = None
) -> tuple[Request, ...]:
    """The workload's requests, numbered in arrival order (``request_id == index``).

    Each request has ``conversation_id`` = its group's index (0..K-1; *not* a corpus
    conversation) and ``turn_index`` 0. ``output_token_ids`` is the ShareGPT reply (cut to the
    output length) when ``output_tokens`` is None, else None. The same config and corpus give
    identical requests; the group prefixes depend only on the seed, K and ``prefix_tokens``.

    Raises:
        ValueError: ``tokenized`` is None while ``question_tokens`` or ``output_tokens`` is
            None, or the corpus has too few usable conversations.
    """
    if config.needs_corpus and tokenized is None:
        raise ValueError(
            "build_shared_prefix: SharedPrefixConfig.question_tokens and output_tokens must "
            "both be ints when no TokenizedCorpus is given"
        )
    prefix_ss, group_ss, question_ss, arrival_ss = np.random.SeedSequence(config.seed).spawn(4)
    n = config.num_requests
    prefixes = _group_prefixes(config, np.random.default_rng(prefix_ss))
    groups = _group_choices(config, np.random.default_rng(group_ss))
    rng = np.random.default_rng(question_ss)
    pairs = _corpus_pairs(config, tokenized, rng) if config.needs_corpus else None
    if config.question_tokens is not None:
        questions = _random_questions(n, config.question_tokens, config.vocab_size, rng)
    else:
        assert pairs is not None
        questions = [user for user, _ in pairs]
    times = _arrival_times(config, np.random.default_rng(arrival_ss))
    slo = None
    if config.slo_ttft is not None and config.slo_itl is not None:
        slo = SLO(config.slo_ttft, config.slo_itl)
    requests = []
    for i in range(n):
        g = int(groups[i])
        prompt = prefixes[g] + questions[i]
        if config.output_tokens is not None:
            out, out_ids = config.output_tokens, None
        else:
            assert pairs is not None
            out_ids = pairs[i][1][: config.max_output_tokens]
            out = len(out_ids)
        requests.append(
            Request(
                request_id=i,
                arrival_time=float(times[i]),
                num_prompt_tokens=len(prompt),
                max_output_tokens=config.max_output_tokens,
                true_output_tokens=out,
                slo=slo,
                prompt_token_ids=prompt,
                conversation_id=g,
                turn_index=0,
                output_token_ids=out_ids,
            )
        )
    return tuple(requests)


def group_weights(config: SharedPrefixConfig) -> np.ndarray:
    """Probability of each group (sums to 1)."""
    k = config.num_groups
    if config.group_popularity == "uniform":
        return np.full(k, 1.0 / k)
    w = 1.0 / np.arange(1, k + 1, dtype=np.float64) ** config.zipf_s
    return w / w.sum()


def _group_prefixes(config: SharedPrefixConfig, rng: np.random.Generator) -> list[tuple[int, ...]]:
    ids = rng.integers(0, config.vocab_size, size=(config.num_groups, config.prefix_tokens))
    return [tuple(row) for row in ids.tolist()]


def _group_choices(config: SharedPrefixConfig, rng: np.random.Generator) -> np.ndarray:
    return rng.choice(config.num_groups, size=config.num_requests, p=group_weights(config))


def _random_questions(
    n: int, length: int, vocab_size: int, rng: np.random.Generator
) -> list[tuple[int, ...]]:
    """``n`` distinct random id tuples (a duplicate is redrawn; the config ensures room)."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for row in rng.integers(0, vocab_size, size=(n, length)).tolist():
        q = tuple(row)
        while q in seen:
            q = tuple(rng.integers(0, vocab_size, size=length).tolist())
        seen.add(q)
        out.append(q)
    return out


def _corpus_pairs(
    config: SharedPrefixConfig, tokenized: TokenizedCorpus | None, rng: np.random.Generator
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(user_ids, reply_ids)`` of the first answered turn of seeded-shuffled conversations.

    Skipped: conversations without an answered first turn, an empty user turn or reply, and
    (when questions come from the corpus) a question longer than ``max_question_tokens`` or
    equal to one already taken.
    """
    assert tokenized is not None
    from_corpus = config.question_tokens is None
    limit = config.max_question_tokens
    seen: set[tuple[int, ...]] = set()
    pairs = []
    for c in rng.permutation(tokenized.num_conversations).tolist():
        first = next(answered_turns(tokenized, c), None)
        if first is None or len(first[1]) == 0 or len(first[2]) == 0:
            continue
        user = tuple(first[1].tolist())
        if from_corpus:
            if user in seen or (limit is not None and len(user) > limit):
                continue
            seen.add(user)
        pairs.append((user, tuple(first[2].tolist())))
        if len(pairs) == config.num_requests:
            return pairs
    raise ValueError(
        f"too few ShareGPT conversations for SharedPrefixConfig.num_requests="
        f"{config.num_requests}: {len(pairs)} usable of {tokenized.num_conversations}"
    )


def _arrival_times(config: SharedPrefixConfig, rng: np.random.Generator) -> np.ndarray:
    if config.arrival == "poisson":
        return arrivals.poisson(config.rate, config.num_requests, rng)
    return arrivals.gamma(config.rate, config.burstiness, config.num_requests, rng)
