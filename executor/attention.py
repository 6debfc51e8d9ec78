"""The paged ``Attention`` the runner injects into the model: KV write, then paged attention.

Per step the runner points it at the step's metadata (views of persistent device buffers); per
layer it writes the new tokens' K/V into that layer's slice of the KV tensor and attends:

    decode-only step    paged_decode_attention  (one query per sequence; CUDA-graph capturable)
    expanded verify     paged_decode_attention  (a verification's k + 1 query tokens as k + 1
                                                 rows of one sequence, causal context lengths)
    any other step      paged_prefill_attention (ragged chunks and decodes together)

On the Triton backend it calls the kernels' launchers directly: the public wrappers re-check
every argument at every call, which costs more host time than the kernels take on small steps;
the runner builds the arguments the same way every step, and the CPU tests check them through
the wrappers' torch backend.
"""

from __future__ import annotations

import torch

from executor.kernels import layer_kv, paged_decode_attention, paged_prefill_attention, write_kv
from executor.kernels.tiling import decode_tiles, prefill_tiles


class PagedAttention:
    """Implements ``executor.model.Attention`` over a ``[layers, 2, blocks, bs, kv_heads, dim]``
    KV tensor. ``set_step`` must be called before each forward; the tensors it is given are read
    at every layer, so a CUDA graph captured through this object replays on their new contents.
    Each call **mutates** the KV tensor at the step's ``slot_mapping`` (``-1``: skipped)."""

    def __init__(self, kv_cache: torch.Tensor, scale: float, backend: str) -> None:
        if backend not in ("triton", "torch"):
            raise ValueError(f"unknown attention backend {backend!r}; known: torch, triton")
        self.backend = backend
        self.scale = scale
        self.k_caches, self.v_caches = zip(*(layer_kv(kv_cache, i) for i in range(len(kv_cache))))
        _, _, _, _, num_kv_heads, head_dim = kv_cache.shape
        self.num_kv_heads = num_kv_heads
        self._decode_tiles = decode_tiles(head_dim)
        self._prefill_tiles: dict[int, object] = {}
        self.decode = False
        self.slot_mapping = self.block_tables = self.context_lens = self.cu_q_lens = None
        self.num_splits = 1

    def set_step(
        self,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        cu_q_lens: torch.Tensor | None,
        num_splits: int = 1,
    ) -> None:
        """Metadata of the next forward. ``cu_q_lens=None`` means a decode-only step (one query
        token per sequence, ``num_splits`` split-K pieces)."""
        self.decode = cu_q_lens is None
        self.slot_mapping = slot_mapping
        self.block_tables = block_tables
        self.context_lens = context_lens
        self.cu_q_lens = cu_q_lens
        self.num_splits = num_splits

    def __call__(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        kc, vc = self.k_caches[layer_idx], self.v_caches[layer_idx]
        if self.backend == "torch":
            write_kv(k, v, kc, vc, self.slot_mapping, backend="torch")
        else:
            from executor.kernels.kv_write import write_kv_triton

            write_kv_triton(k, v, kc, vc, self.slot_mapping)
        return self.attend(layer_idx, q)

    def attend(self, layer_idx: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of ``q`` over the layer's cache, the step's K/V already in it (written by
        ``__call__``, or by the fused RoPE kernel)."""
        kc, vc = self.k_caches[layer_idx], self.v_caches[layer_idx]
        if self.backend == "torch":
            return self._torch(q, kc, vc)
        from executor.kernels.paged_decode import paged_decode_triton
        from executor.kernels.paged_prefill import paged_prefill_triton

        out = torch.empty_like(q)
        if self.decode:
            return paged_decode_triton(
                q,
                kc,
                vc,
                self.block_tables,
                self.context_lens,
                self.scale,
                out,
                self.num_splits,
                self._decode_tiles,
            )
        return paged_prefill_triton(
            q,
            kc,
            vc,
            self.block_tables,
            self.cu_q_lens,
            self.context_lens,
            self.scale,
            out,
            self._tiles_for(q.shape[1] // self.num_kv_heads, q.shape[2]),
        )

    def _tiles_for(self, group: int, head_dim: int):  # noqa: ANN202
        tiles = self._prefill_tiles.get(group)
        if tiles is None:
            tiles = self._prefill_tiles[group] = prefill_tiles(head_dim, group)
        return tiles

    def _torch(self, q, kc, vc) -> torch.Tensor:  # noqa: ANN001
        if self.decode:
            return paged_decode_attention(
                q, kc, vc, self.block_tables, self.context_lens, self.scale, backend="torch"
            )
        return paged_prefill_attention(
            q,
            kc,
            vc,
            self.block_tables,
            self.cu_q_lens,
            self.context_lens,
            self.scale,
            backend="torch",
        )
