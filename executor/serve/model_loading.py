"""What ``--model`` names: a model with real weights and its tokenizer, or a shape with random
weights and the byte tokenizer (forced-length studies, tests).

* a named model of ``executor.named_models`` (e.g. ``smollm2-135m-instruct``): its weights and
  tokenizer, through ``load_named``;
* a preset shape (``executor.model.config.preset_names()``, e.g. ``qwen2.5-7b``), or ``tiny``
  (the tests' 2-layer model): seeded random weights, ``ByteTokenizer`` (or Qwen's BPE with
  ``tokenizer="qwen"``, for load generators' real text).
"""

from __future__ import annotations

import torch

from executor.model import CausalLM, ModelConfig
from executor.model.config import preset_names
from executor.model.testing import tiny_config
from executor.serve.byte_tokenizer import ByteTokenizer
from executor.serve.protocol import TokenizerLike

TINY = "tiny"


def random_shapes() -> list[str]:
    return [TINY, *preset_names()]


TOKENIZERS = ("byte", "qwen")
QWEN_VOCAB = 151_643 + 3  # regular ranks, then <|endoftext|>, <|im_start|>, <|im_end|>


def shape_tokenizer(name: str) -> TokenizerLike:
    """A random-weight shape's tokenizer: ``byte`` (one token per UTF-8 byte) or ``qwen``
    (Qwen's BPE, ``executor.serve.qwen_text``)."""
    if name == "byte":
        return ByteTokenizer()
    if name == "qwen":
        from executor.serve.qwen_text import QwenText

        return QwenText()
    raise ValueError(f"tokenizer: unknown {name!r}; one of {', '.join(TOKENIZERS)}")


def max_positions(name: str) -> int:
    """The longest sequence the model ``name`` takes (its config; no weights loaded). Errors
    as ``load_model``."""
    if name in random_shapes():
        config = tiny_config() if name == TINY else ModelConfig.for_preset(name)
        return config.max_position_embeddings
    from executor.named_models import named_config, named_model_names

    if name not in named_model_names():
        load_model(name, None, "cpu")  # raises the unknown-name error
    return named_config(name).max_position_embeddings


def load_model(
    name: str, dtype: str | None, device: str, seed: int = 0, tokenizer: str = "byte"
) -> tuple[CausalLM, TokenizerLike]:
    """The model ``name`` on ``device`` in ``dtype`` (None: the shape's own; float32 for
    ``tiny``) and its tokenizer (a named model's own; ``tokenizer`` for a random shape).

    Raises:
        ValueError: an unknown name (listing the named models and the random shapes), an
            unknown ``tokenizer``, or a ``qwen`` tokenizer whose ids overflow the shape's
            vocabulary.
        FileNotFoundError: a named model whose weights' package is not installed.
    """
    if name in random_shapes():
        config = tiny_config() if name == TINY else ModelConfig.for_preset(name)
        tok = shape_tokenizer(tokenizer)
        if tokenizer != "byte" and config.vocab_size < QWEN_VOCAB:
            raise ValueError(
                f"tokenizer: {tokenizer!r} ids need a vocabulary of {QWEN_VOCAB:,}; {name!r} "
                f"has {config.vocab_size:,}"
            )
        torch_dtype = getattr(torch, dtype) if dtype else config.torch_dtype
        model = CausalLM(config, device=device, dtype=torch_dtype)
        from executor.bench import device_random_weights

        device_random_weights(model, seed, std=0.2 if name == TINY else 0.02)
        return model, tok
    try:
        from executor.named_models import load_named, named_model_names
    except ImportError:
        load_named, named_model_names = None, list
    if load_named is None or name not in named_model_names():
        raise ValueError(
            f"unknown model {name!r}; named models: {', '.join(named_model_names()) or 'none'}; "
            f"random-weight shapes: {', '.join(random_shapes())}"
        )
    kw = {"device": device} if dtype is None else {"dtype": dtype, "device": device}
    return load_named(name, **kw)
