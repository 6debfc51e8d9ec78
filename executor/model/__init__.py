"""The executor's decoder (Llama / Qwen2 families) in plain PyTorch, on flat token batches.

Attention is injected (see ``Attention``): the engine passes its paged implementation, tests
pass ``DenseAttention``. Weights come from ``executor.weights``.
"""

from .attention import Attention
from .config import ModelConfig, RopeScaling, hf_config_for_preset, preset_names
from .decoder import CausalLM
from .dense_attention import DenseAttention, DenseKVCache, causal_attention

__all__ = [
    "Attention",
    "CausalLM",
    "DenseAttention",
    "DenseKVCache",
    "ModelConfig",
    "RopeScaling",
    "causal_attention",
    "hf_config_for_preset",
    "preset_names",
]
