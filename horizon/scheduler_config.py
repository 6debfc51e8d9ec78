"""The scheduler's configuration: frozen, typed, checked on construction."""

from __future__ import annotations

from dataclasses import dataclass

from horizon.speculation import SpeculationConfig


@dataclass(frozen=True)
class SchedulerConfig:
    """Mechanics shared by every policy and backend.

    Attributes:
        num_blocks / block_size: the KV budget (blocks of ``block_size`` tokens).
        max_num_batched_tokens: per-step token budget (decodes + prefill chunks).
        max_num_seqs: most requests running at once.
        max_model_len: prompt + max_output_tokens must fit (else the request is rejected).
        enable_prefix_caching: reuse cached full prompt blocks.
        step_mode: "event" touches a request only when something happens to it (fast);
            "reference" advances every running request every step (plain, for checking).
        speculation: speculative decoding (``horizon.speculation``); None (default): off, and
            every plan and record is what it was before speculation existed. A mapping (what
            ``dataclasses.asdict`` wrote) is read as a ``SpeculationConfig``.
    """

    num_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 32768
    enable_prefix_caching: bool = True
    step_mode: str = "event"
    speculation: SpeculationConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.speculation, dict):
            object.__setattr__(self, "speculation", SpeculationConfig(**self.speculation))
        if self.speculation is not None and not isinstance(self.speculation, SpeculationConfig):
            raise ValueError(
                "SchedulerConfig.speculation must be None or a SpeculationConfig, got "
                f"{self.speculation!r}"
            )
        for name in (
            "num_blocks",
            "block_size",
            "max_num_batched_tokens",
            "max_num_seqs",
            "max_model_len",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"SchedulerConfig.{name} must be an int >= 1, got {v!r}")
        if self.max_num_batched_tokens < 2:
            raise ValueError(
                "SchedulerConfig.max_num_batched_tokens must be >= 2: a recompute prefill's "
                f"last chunk covers two tokens (got {self.max_num_batched_tokens})"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                "SchedulerConfig.max_num_batched_tokens must be >= max_num_seqs so that every "
                f"running decode fits in a step (got {self.max_num_batched_tokens} < "
                f"{self.max_num_seqs})"
            )
        if self.step_mode not in ("event", "reference"):
            raise ValueError(
                f"SchedulerConfig.step_mode must be 'event' or 'reference', got {self.step_mode!r}"
            )

    @property
    def num_kv_tokens(self) -> int:
        return self.num_blocks * self.block_size
