"""A conversation's answered user turns, as request candidates with chat-templated prompts.

A conversation is used up to the first break in the pattern user, assistant, user, assistant, ...
(starting with a user turn). Answered turn ``k`` pairs user turn ``2k`` with reply ``2k + 1``;
its prompt is the templated history (turns ``0 .. 2k - 1``) plus user turn ``2k``, so the prompt of
turn ``k`` is a token prefix of the prompt of turn ``k + 1``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from horizon.workload.filters import FilterTally, LengthFilter
from horizon.workload.tokenized import TokenizedCorpus


@dataclass(frozen=True)
class RequestSpec:
    """A request before it has an id and an arrival time."""

    num_prompt_tokens: int
    output_tokens: int  # the reply's length, capped
    clamped: bool  # the reply was longer than the cap
    prompt_token_ids: tuple[int, ...] | None = None
    conversation_id: int = -1
    turn_index: int = 0
    row: int = -1  # Azure: the trace row it came from


def answered_turns(
    tokenized: TokenizedCorpus, conversation: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """``(k, user_ids, reply_ids)`` for each answered user turn, in order."""
    for k in range(tokenized.num_turns(conversation) // 2):
        user, reply = 2 * k, 2 * k + 1
        if tokenized.turn_role(conversation, user) != "user":
            return
        if tokenized.turn_role(conversation, reply) != "assistant":
            return
        yield k, tokenized.turn_ids(conversation, user), tokenized.turn_ids(conversation, reply)


def conversation_requests(
    tokenized: TokenizedCorpus,
    conversation: int,
    limits: LengthFilter,
    tally: FilterTally,
    max_turns: int | None = None,
) -> list[RequestSpec]:
    """Request candidates for the conversation's first ``max_turns`` answered turns (all: None).

    The first turn that ``limits`` drops ends the conversation there (a later prompt would
    contain it): its reason is counted in ``tally.dropped`` and the answered turns after it in
    ``tally.turns_cut``. A conversation with no answered turn counts as ``no_user_reply_pair``.
    The history keeps each reply in full, even when its request's output is capped.
    """
    template = tokenized.template
    pairs = list(answered_turns(tokenized, conversation))[:max_turns]
    if not pairs:
        tally.drop("no_user_reply_pair")
        return []
    specs: list[RequestSpec] = []
    history: list[int] = []
    for k, user, reply in pairs:
        prompt = template.generation_prompt(history, user.tolist())
        reason = limits.drop_reason(len(user), len(prompt), len(reply))
        if reason is not None:
            tally.drop(reason)
            tally.turns_cut += len(pairs) - k - 1
            break
        out = limits.capped(len(reply))
        specs.append(
            RequestSpec(
                num_prompt_tokens=len(prompt),
                output_tokens=out,
                clamped=out < len(reply),
                prompt_token_ids=tuple(prompt),
                conversation_id=conversation,
                turn_index=k,
            )
        )
        history = [*prompt, *reply.tolist(), *template.turn_end]
    return specs
