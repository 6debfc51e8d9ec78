"""A small reader and writer of the safetensors format, so that loading checkpoints needs no
package beyond torch and numpy.

Format: an 8-byte little-endian header length ``N``; ``N`` bytes of JSON mapping each tensor name
to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the byte buffer that
follows the header) plus an optional ``"__metadata__"`` dict of strings; then the buffer.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_CODES = {v: k for k, v in _DTYPES.items()}
_MAX_HEADER = 100 << 20


class SafetensorsFile:
    """Tensors of one ``.safetensors`` file, memory-mapped: ``get`` reads only what it returns.

    Raises ValueError (naming the file and, where it applies, the tensor) for a malformed file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ValueError(f"{self.path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER:
                raise ValueError(f"{self.path}: implausible safetensors header length {n}")
            try:
                header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{self.path}: bad safetensors header ({e})") from None
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._start = 8 + n
        self._entries: dict[str, dict] = header
        size = self.path.stat().st_size - self._start
        for name, e in header.items():
            if e.get("dtype") not in _DTYPES:
                raise ValueError(
                    f"{self.path}: tensor {name!r} has unsupported dtype {e.get('dtype')!r}"
                )
            begin, end = e["data_offsets"]
            want = _DTYPES[e["dtype"]].itemsize * _numel(e["shape"])
            if not 0 <= begin <= end <= size or end - begin != want:
                raise ValueError(
                    f"{self.path}: tensor {name!r} has bad data_offsets {[begin, end]}"
                )
        self._mmap: np.memmap | None = None

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entry(name)["shape"])

    def dtype(self, name: str) -> torch.dtype:
        return _DTYPES[self._entry(name)["dtype"]]

    def get(self, name: str) -> torch.Tensor:
        """A CPU tensor backed by the file's pages (copy-on-write: writing to it leaves the file
        unchanged)."""
        e = self._entry(name)
        shape, dtype = tuple(e["shape"]), _DTYPES[e["dtype"]]
        if _numel(shape) == 0:
            return torch.empty(shape, dtype=dtype)
        if self._mmap is None:
            self._mmap = np.memmap(self.path, dtype=np.uint8, mode="c")
        begin, end = e["data_offsets"]
        raw = torch.from_numpy(self._mmap[self._start + begin : self._start + end])
        return raw.view(dtype).reshape(shape)

    def _entry(self, name: str) -> dict:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r}") from None


def write_safetensors(
    path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write ``tensors`` (any device; copied to the host one at a time) to ``path``.

    Tensors are laid out largest element size first, so every one is aligned to its size.
    """
    for name, t in tensors.items():
        if t.dtype not in _CODES:
            raise ValueError(f"tensor {name!r} has unsupported dtype {t.dtype}")
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name in order:
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        header[name] = {
            "dtype": _CODES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in order:
            t = tensors[name].detach().to("cpu").contiguous().reshape(-1)
            if t.numel():
                f.write(t.view(torch.uint8).numpy().data)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
