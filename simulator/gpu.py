"""Accelerator figures the analytic cost model uses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """Measured (not datasheet) throughput of one accelerator.

    Attributes:
        name: e.g. "H200".
        mem_bandwidth: bytes/s a large device copy achieves.
        peak_flops: dense bf16 matmul FLOP/s achieved.
        memory_bytes: device memory.
    """

    name: str
    mem_bandwidth: float
    peak_flops: float
    memory_bytes: float

    def __post_init__(self) -> None:
        for f in ("mem_bandwidth", "peak_flops", "memory_bytes"):
            v = getattr(self, f)
            if not v > 0:
                raise ValueError(f"GpuSpec.{f} must be > 0, got {v!r}")


_GPUS = {
    # docs/design.md, "Engine notes": ≈ 4.2 TB/s copy bandwidth and ≈ 790 TFLOP/s dense bf16,
    # measured on an H200.
    "H200": GpuSpec("H200", mem_bandwidth=4.2e12, peak_flops=790e12, memory_bytes=141e9),
}


def gpu_spec(name: str) -> GpuSpec:
    try:
        return _GPUS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(_GPUS))}") from None
