"""Train/test request sets for output-length predictors, split by conversation.

Every answered turn of a ShareGPT conversation becomes a request (its prompt is the
chat-templated history, as in a multi-turn workload), so first turns and later turns are both
present. Conversations, not requests, are dealt to the splits: a conversation's turns never
straddle train and test (a later turn's prompt contains the earlier replies, so a request split
would leak test replies into training prompts).

The held-out conversations are ``horizon.workload.split.held_out_conversations(n, seed,
test_fraction)``, the rule workloads use too: a workload built with
``WorkloadConfig(conversations="held_out", split_seed=seed, split_test_fraction=test_fraction)``
never contains a conversation a predictor trained on this split has seen.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from horizon.request import Request
from horizon.workload.builder import reply_token_ids
from horizon.workload.filters import FilterTally, LengthFilter
from horizon.workload.split import held_out_conversations
from horizon.workload.tokenized import TokenizedCorpus
from horizon.workload.turns import conversation_requests


@dataclass(frozen=True)
class SplitConfig:
    """How to turn a tokenised corpus into train and test requests.

    Fields:
        seed, test_fraction: the held-out conversations (``held_out_conversations``); the
            workload's ``split_seed`` and ``split_test_fraction``.
        max_conversations: use only a seeded random subset of this many conversations (train
            and test shrink alike; held-out ones stay held out); None = all.
        max_turns: answered turns per conversation (1 = first turns only); None = all.
        max_output_tokens, min_prompt_tokens, min_output_tokens, max_prompt_tokens,
        max_total_tokens: the workload's length filters (``horizon.workload.LengthFilter``);
            the defaults are those of the multi-turn workload preset.
    """

    seed: int = 0
    test_fraction: float = 0.2
    max_conversations: int | None = None
    max_turns: int | None = None
    max_output_tokens: int = 2048
    min_prompt_tokens: int | None = 4
    min_output_tokens: int | None = 4
    max_prompt_tokens: int | None = 4096
    max_total_tokens: int | None = 6144

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"SplitConfig.seed must be an int >= 0, got {self.seed!r}")
        if not 0 < self.test_fraction < 1:
            raise ValueError(
                f"SplitConfig.test_fraction must be in (0, 1), got {self.test_fraction}"
            )
        for name in ("max_conversations", "max_turns"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"SplitConfig.{name} must be an int >= 1 or None, got {v!r}")

    def length_filter(self) -> LengthFilter:
        return LengthFilter(
            max_output_tokens=self.max_output_tokens,
            min_prompt_tokens=self.min_prompt_tokens,
            min_output_tokens=self.min_output_tokens,
            max_prompt_tokens=self.max_prompt_tokens,
            max_total_tokens=self.max_total_tokens,
        )


@dataclass(frozen=True, eq=False)
class RequestSplit:
    """Train and test requests (ids 0..n_train-1, then the test ids), and where they came from.

    Requests are fresh (unstarted) and carry ``arrival_time=0``: they are prediction examples,
    not a timed workload; they carry their reply ids (``output_token_ids``). ``info`` is JSON-able:
    the config, the corpus source and counts.
    """

    train: tuple[Request, ...]
    test: tuple[Request, ...]
    info: dict


def split_requests(tokenized: TokenizedCorpus, config: SplitConfig | None = None) -> RequestSplit:
    """Requests for every answered turn, dealt to train/test by conversation (module docstring).

    Raises:
        ValueError: a split ends up empty.
    """
    config = config or SplitConfig()
    n = tokenized.num_conversations
    held = held_out_conversations(n, config.seed, config.test_fraction)
    used = range(n)
    if config.max_conversations is not None and config.max_conversations < n:
        # A stream of its own: the held-out rule's permutation starts with the held-out ones.
        pick = np.random.default_rng([config.seed, 1]).permutation(n)[: config.max_conversations]
        used = sorted(pick.tolist())
    limits, tally = config.length_filter(), FilterTally()
    train_specs, test_specs = [], []
    n_test = 0
    for c in used:
        specs = conversation_requests(tokenized, c, limits, tally, config.max_turns)
        n_test += c in held
        (test_specs if c in held else train_specs).extend(specs)
    if not train_specs or not test_specs:
        raise ValueError(
            f"empty split: {len(train_specs)} train / {len(test_specs)} test requests from "
            f"{len(used)} conversations"
        )
    train = _requests(train_specs, 0, config.max_output_tokens, tokenized)
    test = _requests(test_specs, len(train), config.max_output_tokens, tokenized)
    info = {
        "config": asdict(config),
        "source": tokenized.source,
        "tokenizer": tokenized.tokenizer_name,
        "conversations": len(used),
        "test_conversations": n_test,
        "train_requests": len(train),
        "test_requests": len(test),
        "dropped": dict(tally.dropped),
    }
    return RequestSplit(train=train, test=test, info=info)


def _requests(
    specs: list, first_id: int, max_output_tokens: int, tokenized: TokenizedCorpus
) -> tuple[Request, ...]:
    return tuple(
        Request(
            request_id=first_id + i,
            arrival_time=0.0,
            num_prompt_tokens=s.num_prompt_tokens,
            max_output_tokens=max_output_tokens,
            true_output_tokens=s.output_tokens,
            prompt_token_ids=s.prompt_token_ids,
            conversation_id=s.conversation_id,
            turn_index=s.turn_index,
            output_token_ids=reply_token_ids(tokenized, s),
        )
        for i, s in enumerate(specs)
    )


def split_by_conversation(
    requests: Sequence[Request], fraction: float, seed: int
) -> tuple[list[Request], list[Request]]:
    """``(rest, held_out)``: about ``fraction`` of the conversations go to ``held_out``.

    Requests without a conversation (``conversation_id == -1``) count as their own one.
    """
    keys = sorted({_conversation_key(r) for r in requests})
    rng = np.random.default_rng(seed)
    n_out = min(len(keys) - 1, max(1, round(len(keys) * fraction)))
    held = {keys[i] for i in rng.permutation(len(keys))[:n_out].tolist()}
    rest = [r for r in requests if _conversation_key(r) not in held]
    out = [r for r in requests if _conversation_key(r) in held]
    return rest, out


def _conversation_key(r: Request) -> tuple[int, int]:
    return (r.conversation_id, -1) if r.conversation_id >= 0 else (-1, r.request_id)


def fingerprint(requests: Sequence[Request]) -> dict:
    """What a model was trained on: a count and a digest of every example's prompt and label."""
    h = hashlib.sha256()
    for r in requests:
        h.update(
            np.asarray(
                [r.conversation_id, r.turn_index, r.num_prompt_tokens, r.true_output_tokens],
                dtype=np.int64,
            ).tobytes()
        )
        if r.prompt_token_ids is not None:
            h.update(np.asarray(r.prompt_token_ids, dtype=np.int32).tobytes())
    return {"requests": len(requests), "sha256": h.hexdigest()}
