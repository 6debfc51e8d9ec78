"""Weights of ``executor.model.CausalLM``: HF safetensors checkpoints in and out, or seeded random.

HF checkpoints keep q/k/v and gate/up projections apart; the model fuses them. Every HF tensor
maps to a parameter, or to a block of rows of one (``hf_parameter_map``).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from executor.model.config import ModelConfig
from executor.model.decoder import CausalLM
from executor.model.safetensors_io import SafetensorsFile, write_safetensors

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry


@dataclass(frozen=True)
class Target:
    """Where one HF tensor lives in the model: rows ``[start, stop)`` of dim 0 of ``param``
    (the whole parameter when ``start`` is None)."""

    param: str
    start: int | None = None
    stop: int | None = None

    def view(self, p: torch.Tensor) -> torch.Tensor:
        return p if self.start is None else p[self.start : self.stop]


def hf_parameter_map(config: ModelConfig) -> dict[str, Target]:
    """HF tensor name -> its place in ``CausalLM``, for every tensor a checkpoint must hold."""
    q, kv, i = config.q_size, config.kv_size, config.intermediate_size
    m: dict[str, Target] = {"model.embed_tokens.weight": Target("embed_tokens.weight")}
    for n in range(config.num_layers):
        hf, own = f"model.layers.{n}.", f"layers.{n}."
        params = ["weight", "bias"] if config.qkv_bias else ["weight"]
        for p in params:
            qkv = own + f"self_attn.qkv_proj.{p}"
            m[hf + f"self_attn.q_proj.{p}"] = Target(qkv, 0, q)
            m[hf + f"self_attn.k_proj.{p}"] = Target(qkv, q, q + kv)
            m[hf + f"self_attn.v_proj.{p}"] = Target(qkv, q + kv, q + 2 * kv)
        for p in ["weight", "bias"] if config.o_proj_bias else ["weight"]:
            m[hf + f"self_attn.o_proj.{p}"] = Target(own + f"self_attn.o_proj.{p}")
        m[hf + "mlp.gate_proj.weight"] = Target(own + "mlp.gate_up_proj.weight", 0, i)
        m[hf + "mlp.up_proj.weight"] = Target(own + "mlp.gate_up_proj.weight", i, 2 * i)
        for name in ("mlp.down_proj.weight", "input_layernorm.weight"):
            m[hf + name] = Target(own + name)
        m[hf + "post_attention_layernorm.weight"] = Target(own + "post_attention_layernorm.weight")
    m["model.norm.weight"] = Target("norm.weight")
    if not config.tie_word_embeddings:
        m["lm_head.weight"] = Target("lm_head.weight")
    return m


def checkpoint_files(path_or_dir: str | Path) -> list[Path]:
    """The ``.safetensors`` files of a checkpoint: the file itself, the shards its directory's
    ``model.safetensors.index.json`` lists, or the directory's ``model.safetensors``."""
    path = Path(path_or_dir)
    if path.is_file():
        return [path]
    if (path / INDEX_FILE).is_file():
        weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    raise ValueError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE}")


def load_safetensors(model: CausalLM, path_or_dir: str | Path) -> None:
    """Copy a HF-named safetensors checkpoint into ``model`` (cast to its dtype and device).

    Everything is checked before anything is copied: a missing, unexpected or wrongly shaped
    tensor, one listed twice, or one the index lists in a file that lacks it raises ValueError
    naming it, and leaves the model unchanged. When embeddings are tied, a checkpoint's
    ``lm_head.weight`` is ignored.
    """
    files = [SafetensorsFile(f) for f in checkpoint_files(path_or_dir)]
    where = _locate(files, Path(path_or_dir))
    mapping = hf_parameter_map(model.config)
    params = dict(model.named_parameters())
    ignored = {n for n in where if n.endswith(_IGNORED_SUFFIXES)}
    if model.config.tie_word_embeddings:
        ignored.add("lm_head.weight")
    _no_names("unexpected tensors in checkpoint", sorted(set(where) - set(mapping) - ignored))
    _no_names("checkpoint lacks tensors", [n for n in mapping if n not in where])
    for name, target in mapping.items():
        f = where[name]
        want = tuple(target.view(params[target.param]).shape)
        if f.shape(name) != want:
            raise ValueError(
                f"tensor {name!r} in {f.path.name} has shape {list(f.shape(name))}, "
                f"expected {list(want)}"
            )
        if not f.dtype(name).is_floating_point:
            raise ValueError(
                f"tensor {name!r} in {f.path.name} has non-float dtype {f.dtype(name)}"
            )
    with torch.no_grad():
        for name, target in mapping.items():
            target.view(params[target.param]).copy_(where[name].get(name))


def _locate(files: list[SafetensorsFile], path: Path) -> dict[str, SafetensorsFile]:
    where: dict[str, SafetensorsFile] = {}
    for f in files:
        for name in f.names():
            if name in where:
                raise ValueError(f"tensor {name!r} is in both {where[name].path} and {f.path}")
            where[name] = f
    index = path / INDEX_FILE
    if path.is_dir() and index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        for name, file in weight_map.items():
            if name not in where or where[name].path.name != file:
                raise ValueError(f"{INDEX_FILE} places tensor {name!r} in {file}, which lacks it")
    return where


def _no_names(what: str, names: list[str]) -> None:
    if names:
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        raise ValueError(f"{what}: {shown}")


def random_weights(model: CausalLM, seed: int, std: float = 0.02) -> None:
    """Fill ``model`` with seeded random weights, identical on every device and dtype up to the
    final cast: each parameter is drawn in fp32 on the CPU from its own generator (seeded from
    ``seed`` and the parameter's name), then copied. Norm weights are 1; every other weight and
    bias is ``normal(0, std)`` (HF's ``initializer_range``), which keeps bf16 activations finite
    through dozens of layers.
    """
    named = list(model.named_parameters())

    def fill(item: tuple[str, torch.nn.Parameter]) -> None:
        name, p = item
        with torch.no_grad():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                return
            g = torch.Generator().manual_seed(_param_seed(seed, name))
            p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, std, generator=g))

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(fill, named))


def _param_seed(seed: int, name: str) -> int:
    return (seed * 0x9E3779B1 + zlib.crc32(name.encode())) % (1 << 63)


def export_hf_state_dict(model: CausalLM) -> dict[str, torch.Tensor]:
    """The model's weights under HF names (views of its parameters, detached), as a HF
    ``Qwen2ForCausalLM`` / ``LlamaForCausalLM`` expects them; ``lm_head.weight`` is left out
    when tied (as published tied checkpoints do)."""
    params = dict(model.named_parameters())
    return {
        name: target.view(params[target.param]).detach()
        for name, target in hf_parameter_map(model.config).items()
    }


def save_safetensors(
    model: CausalLM,
    directory: str | Path,
    config: ModelConfig | dict[str, Any] | None = None,
    max_shard_bytes: int | None = None,
) -> list[Path]:
    """Write ``config.json`` and the weights (HF names, the model's dtype) into ``directory``:
    ``model.safetensors``, or shards plus ``model.safetensors.index.json`` when the weights
    exceed ``max_shard_bytes``. Overwrites those files. Returns the weight files written.

    ``config`` defaults to ``model.config``; a dict is written as given.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config if config is None else config
    hf = config.to_hf_config() if isinstance(config, ModelConfig) else config
    (directory / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    state = export_hf_state_dict(model)
    shards = list(_shards(state, max_shard_bytes))
    if len(shards) == 1:
        (directory / INDEX_FILE).unlink(missing_ok=True)
        write_safetensors(directory / SINGLE_FILE, shards[0])
        return [directory / SINGLE_FILE]
    paths, weight_map = [], {}
    for i, shard in enumerate(shards):
        path = directory / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(path, shard)
        weight_map.update({name: path.name for name in shard})
        paths.append(path)
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return paths


def _shards(
    state: dict[str, torch.Tensor], max_bytes: int | None
) -> Iterable[dict[str, torch.Tensor]]:
    shard: dict[str, torch.Tensor] = {}
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shard and max_bytes is not None and size + nbytes > max_bytes:
            yield shard
            shard, size = {}, 0
        shard[name] = t
        size += nbytes
    yield shard
