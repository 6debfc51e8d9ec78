"""vLLM-style length filters and the output cap, with a per-build tally of what they did."""

from __future__ import annotations

from dataclasses import dataclass, field

from horizon.workload.config import WorkloadConfig

# Why a candidate request was dropped, in the order the checks run.
DROP_REASONS = (
    "no_user_reply_pair",  # (ShareGPT) the conversation does not start with a user turn + reply
    "zero_prompt",  # the user text (ShareGPT) or ContextTokens (Azure) has 0 tokens
    "zero_output",  # the reply has 0 tokens
    "output_too_short",  # reply < min_output_tokens
    "prompt_too_short",  # prompt < min_prompt_tokens
    "prompt_too_long",  # prompt > max_prompt_tokens
    "total_too_long",  # prompt + (capped) output > max_total_tokens
)


@dataclass(frozen=True)
class LengthFilter:
    """Length limits of one workload (None = that check is off). Build with ``from_config``."""

    max_output_tokens: int
    min_prompt_tokens: int | None
    min_output_tokens: int | None
    max_prompt_tokens: int | None
    max_total_tokens: int | None

    @classmethod
    def from_config(cls, config: WorkloadConfig) -> LengthFilter:
        return cls(
            max_output_tokens=config.max_output_tokens,
            min_prompt_tokens=config.min_prompt_tokens,
            min_output_tokens=config.min_output_tokens,
            max_prompt_tokens=config.max_prompt_tokens,
            max_total_tokens=config.max_total_tokens,
        )

    def capped(self, output_tokens: int) -> int:
        """The output length a request gets: the reply's, clamped to ``max_output_tokens``."""
        return min(output_tokens, self.max_output_tokens)

    def drop_reason(self, text_tokens: int, prompt_tokens: int, output_tokens: int) -> str | None:
        """The first ``DROP_REASONS`` entry that applies, or None to keep the request.

        Args:
            text_tokens: tokens of the user's own text (emptiness check only).
            prompt_tokens: the request's prompt as the engine sees it (templated, with history).
            output_tokens: the reply's length before the cap; ``total_too_long`` uses the capped
                length (what the request will really generate).
        """
        if text_tokens == 0:
            return "zero_prompt"
        if output_tokens == 0:
            return "zero_output"
        if self.min_output_tokens is not None and output_tokens < self.min_output_tokens:
            return "output_too_short"
        if self.min_prompt_tokens is not None and prompt_tokens < self.min_prompt_tokens:
            return "prompt_too_short"
        if self.max_prompt_tokens is not None and prompt_tokens > self.max_prompt_tokens:
            return "prompt_too_long"
        total = prompt_tokens + self.capped(output_tokens)
        if self.max_total_tokens is not None and total > self.max_total_tokens:
            return "total_too_long"
        return None


@dataclass
class FilterTally:
    """Counts of one ``build_workload`` call (never shared between builds)."""

    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    examined: int = 0  # conversations (ShareGPT) or rows (Azure) looked at
    turns_cut: int = 0  # multi-turn: answered turns lost after a dropped turn of their conversation

    def drop(self, reason: str) -> None:
        self.dropped[reason] += 1
