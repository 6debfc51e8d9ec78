"""Copy a request's KV blocks from one replica's KV tensor into another's (P/D disaggregation).

A replica process holds one KV tensor (``executor.kernels.allocate_kv_cache``)::

    kv[layer, side, block, offset, kv_head, dim]    [layers, 2, num_blocks, 16, kv_heads, dim]

A block id indexes dim 2; one block of every layer, K and V, is ``layers * 2`` runs of
``block_size * kv_heads * dim`` contiguous elements. ``copy_blocks`` views both tensors as
``[layers * 2, num_blocks, block_size * kv_heads * dim]`` and moves the listed blocks with one
``index_select`` (a gather into a temporary ``[layers * 2, n, row]``) and one ``index_copy_``
(a scatter into the destination): two kernels whatever the model's depth, plus the two small
host-to-device copies of the block ids.

Sharing (how a peer process opens a replica's KV tensor):

``share_kv(kv)`` returns bytes, ``open_kv(blob)`` in the peer returns a tensor on the same memory.
The bytes are ``multiprocessing``'s ``ForkingPickler`` serialisation with torch's reducers
(``torch.multiprocessing.reductions``), i.e. exactly what putting the tensor on a spawn-context
``multiprocessing`` queue would send, but split so that the receiver can time the open and any
transport (a ``Pipe``'s ``send_bytes``, a queue, a socket) can carry it:

* CUDA: the reducer calls ``tensor.untyped_storage()._share_cuda_()``: a ``cudaIpcMemHandle`` of
  the caching allocator's segment holding the tensor, its offset, a shared reference counter and
  an IPC event (the peer waits on it at open, so writes issued before ``share_kv`` are visible).
  ``open_kv`` maps the memory with ``cudaIpcOpenMemHandle`` (lazy peer access enabled). The
  sharing process must keep ``kv`` alive, and should outlive the peer's use of it (torch warns
  when a producer exits while a consumer still holds a shared CUDA tensor).
* CPU: ``kv.share_memory_()`` first (moves the storage into shared memory in place; views of
  ``kv`` follow), then the reducer sends the shared memory's file descriptor through
  ``multiprocessing``'s resource sharer. A CPU blob can be opened **once**, by one process, while
  the sharing process is alive.

Placement (what differs between one GPU and two):

* One GPU, two processes: the opened tensor is on the same device as the peer's own; the gather
  and the scatter both run on ``stream``; the copy moves ``2 * bytes`` through HBM.
* Two GPUs (source on ``cuda:i``, destination on ``cuda:j`` of the process that copies): the
  gather runs on ``cuda:i``'s current stream, the temporary crosses with one device-to-device
  copy (NVLink/PCIe peer access, which torch enables on first use; without peer access the CUDA
  driver stages it through the host), and the scatter runs on ``stream``, which must be on
  ``cuda:j``; torch orders the three with events across the two devices' streams. Both GPUs must
  be visible to the copying process (same ``CUDA_VISIBLE_DEVICES`` numbering as the sharer's
  device, which the IPC handle names).

Neither path synchronises with the host: the returned event says when the destination blocks are
complete. Ordering with the *source* replica (its blocks must hold the prefill's KV before the copy
starts, and must not be reused until the event has completed) is the caller's protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401 - registers torch's reducers on ForkingPickler

__all__ = ["copy_blocks", "open_kv", "share_kv"]

BlockIds = Sequence[int] | torch.Tensor


def _kv_error(name: str, kv: object) -> str | None:
    """Why ``kv`` is not a KV tensor ``[layers, 2, blocks, block_size, kv_heads, dim]``, or None."""
    if not isinstance(kv, torch.Tensor):
        return f"{name}: expected a torch.Tensor, got {type(kv).__name__}"
    if kv.dim() != 6 or kv.shape[1] != 2:
        shape = tuple(kv.shape)
        return f"{name}: expected [layers, 2, blocks, block_size, kv_heads, dim], got {shape}"
    if not kv.is_contiguous():
        return f"{name}: must be contiguous (as allocate_kv_cache returns it)"
    if kv.device.type not in ("cpu", "cuda"):
        return f"{name}: on {kv.device}; only cpu and cuda tensors are supported"
    return None


def share_kv(kv: torch.Tensor) -> bytes:
    """What a replica process sends a peer so that the peer can open ``kv`` (see the module
    docstring): ``ForkingPickler`` bytes of ``kv`` (CPU: after ``kv.share_memory_()``, in place).

    Raises ValueError (naming ``kv``) if ``kv`` is not a contiguous 6-D KV tensor on cpu/cuda."""
    error = _kv_error("kv", kv)
    if error:
        raise ValueError(error)
    if kv.device.type == "cpu":
        kv.share_memory_()
    return bytes(ForkingPickler.dumps(kv))


def open_kv(blob: bytes) -> torch.Tensor:
    """The peer's KV tensor from ``share_kv``'s bytes, on the sharer's memory (CUDA: the IPC open;
    on the sharer's device index). Raises ValueError (naming ``blob``) if it is not a KV tensor."""
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise ValueError(f"blob: expected the bytes of share_kv, got {type(blob).__name__}")
    kv = ForkingPickler.loads(blob)
    error = _kv_error("blob", kv)
    if error:
        raise ValueError(error)
    return kv


def _block_ids(name: str, ids: BlockIds, num_blocks: int) -> list[int]:
    """``ids`` as a list of ints in ``[0, num_blocks)``; ValueError naming ``name`` otherwise."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(
                f"{name}: expected a 1-D integer tensor, got {ids.dtype} {tuple(ids.shape)}"
            )
        if ids.device.type != "cpu":
            raise ValueError(f"{name}: block ids must be on the host, got a {ids.device} tensor")
        ids = ids.tolist()
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise ValueError(f"{name}: expected a sequence of block ids, got {type(ids).__name__}")
    out = []
    for b in ids:
        if isinstance(b, bool) or not isinstance(b, int):
            raise ValueError(f"{name}: block ids must be ints, got {b!r}")
        if not 0 <= b < num_blocks:
            raise ValueError(f"{name}: block {b} out of range [0, {num_blocks})")
        out.append(int(b))
    return out


def _check_copy(
    src_kv: torch.Tensor, dst_kv: torch.Tensor, src_blocks: BlockIds, dst_blocks: BlockIds
) -> tuple[list[int], list[int]]:
    """Validate ``copy_blocks``' tensors and ids; return the ids as lists of ints."""
    for name, kv in (("src_kv", src_kv), ("dst_kv", dst_kv)):
        error = _kv_error(name, kv)
        if error:
            raise ValueError(error)
    if dst_kv.dtype != src_kv.dtype:
        raise ValueError(f"dst_kv: dtype {dst_kv.dtype} differs from src_kv's {src_kv.dtype}")
    block_shape = lambda kv: (*kv.shape[:2], *kv.shape[3:])  # noqa: E731 - shape less dim 2
    if block_shape(dst_kv) != block_shape(src_kv):
        raise ValueError(
            f"dst_kv: block shape {block_shape(dst_kv)} differs from src_kv's {block_shape(src_kv)}"
            " ([layers, 2, block_size, kv_heads, dim])"
        )
    if (src_kv.device.type == "cuda") != (dst_kv.device.type == "cuda"):
        raise ValueError(
            f"dst_kv: on {dst_kv.device} but src_kv on {src_kv.device}; both cpu or both cuda"
        )
    src = _block_ids("src_blocks", src_blocks, src_kv.shape[2])
    dst = _block_ids("dst_blocks", dst_blocks, dst_kv.shape[2])
    if len(dst) != len(src):
        raise ValueError(f"dst_blocks: {len(dst)} ids but src_blocks has {len(src)}")
    if len(set(dst)) != len(dst):
        twice = next(b for i, b in enumerate(dst) if b in dst[:i])
        raise ValueError(f"dst_blocks: block {twice} listed twice")
    return src, dst


def _flat(kv: torch.Tensor) -> torch.Tensor:
    """``kv`` viewed as ``[layers * 2, num_blocks, block_size * kv_heads * dim]`` (no copy)."""
    return kv.view(kv.shape[0] * 2, kv.shape[2], -1)


def _device_ids(ids: list[int], device: torch.device) -> torch.Tensor:
    """``ids`` as int64 on ``device``, copied from pinned memory without a host sync (on the
    device's current stream; the host allocator keeps the pinned buffer until that copy is done)."""
    host = torch.tensor(ids, dtype=torch.int64)
    return host.pin_memory().to(device, non_blocking=True)


def copy_blocks(
    src_kv: torch.Tensor,
    dst_kv: torch.Tensor,
    src_blocks: BlockIds,
    dst_blocks: BlockIds,
    stream: torch.cuda.Stream | None = None,
) -> torch.cuda.Event | None:
    """Copy block ``src_blocks[i]`` of ``src_kv`` into block ``dst_blocks[i]`` of ``dst_kv``, for
    every ``i``, every layer, K and V (see the module docstring for the kernels and placements).

    Args:
        src_kv, dst_kv: contiguous KV tensors ``[layers, 2, blocks, block_size, kv_heads, dim]``
            of one dtype and one block shape (their block counts may differ); both on the CPU, or
            both on CUDA (one device, or two with peer access). ``dst_kv`` is **mutated**: the
            listed blocks only. ``src_kv`` may be ``dst_kv`` (the gather copies first).
        src_blocks, dst_blocks: host block ids (ints, or a 1-D integer CPU tensor), equal lengths,
            in range; ``dst_blocks`` distinct (a source block may be listed more than once).
        stream: CUDA only: the stream on ``dst_kv``'s device that the copy is issued on (default:
            its current stream). It first waits for that device's current stream, so work queued
            there before the call (in this process) is ordered before the copy.

    Returns:
        CUDA: an event recorded on ``stream`` after the copy; the blocks are complete once it has
        completed. Nothing waits on the host. CPU: None; the copy is done when this returns.

    Raises:
        ValueError: one line naming the argument at fault (``src_kv``, ``dst_kv``,
            ``src_blocks``, ``dst_blocks`` or ``stream``).
    """
    src_ids, dst_ids = _check_copy(src_kv, dst_kv, src_blocks, dst_blocks)
    if dst_kv.device.type == "cpu":
        if stream is not None:
            raise ValueError("stream: given, but the KV tensors are on the CPU")
        src_idx = torch.tensor(src_ids, dtype=torch.int64)
        dst_idx = torch.tensor(dst_ids, dtype=torch.int64)
        _flat(dst_kv).index_copy_(1, dst_idx, _flat(src_kv).index_select(1, src_idx))
        return None
    device = dst_kv.device
    if stream is None:
        stream = torch.cuda.current_stream(device)
    elif not isinstance(stream, torch.cuda.Stream) or stream.device != device:
        raise ValueError(f"stream: expected a torch.cuda.Stream on dst_kv's device {device}")
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        src_idx = _device_ids(src_ids, src_kv.device)  # on src's device (its current stream)
        dst_idx = _device_ids(dst_ids, device)
        gathered = _flat(src_kv).index_select(1, src_idx)
        if src_kv.device != device:  # two GPUs: one peer copy of the gathered blocks
            gathered = gathered.to(device, non_blocking=True)
        _flat(dst_kv).index_copy_(1, dst_idx, gathered)
        event = torch.cuda.Event()
        event.record(stream)
    return event
