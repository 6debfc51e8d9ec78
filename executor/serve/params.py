"""One request's generation parameters, as the engine thread applies them."""

from __future__ import annotations

from dataclasses import dataclass, field

from executor.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationParams:
    """How a request generates and when it stops.

    Attributes:
        max_tokens: at most this many tokens (finish reason "length").
        min_tokens: end-of-sequence and stop strings do not stop it before this many tokens;
            as in vLLM, the end-of-sequence ids are not sampled before then (unless
            ``ignore_eos``: then nothing is masked).
        ignore_eos: end-of-sequence never stops it. With ``min_tokens == max_tokens`` a request
            generates exactly ``max_tokens`` tokens (forced lengths).
        stop: strings that end the text (finish reason "stop"); the stop string itself is not
            returned, and text that may begin one is held back until it is told apart.
        sampling: temperature (0: greedy), top-k, top-p, min-p and seed.
        skip_special_tokens: special tokens add no text.
    """

    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in 0..max_tokens ({self.max_tokens}), got {self.min_tokens!r}"
            )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")

    @property
    def forced_length(self) -> bool:
        """Whether the output length is exactly ``max_tokens`` whatever is sampled."""
        return self.ignore_eos and self.min_tokens == self.max_tokens and not self.stop
