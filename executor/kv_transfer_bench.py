"""Time copying N KV blocks from one replica process's KV tensor into another's.

    python -m executor.kv_transfer_bench [--shape qwen2.5-0.5b[,qwen2.5-7b]]
        [--sizes 1,2,4,8,16,32,64,128,256] [--repeats 20] [--warmup 3] [--num-blocks 512]
        [--device cuda|cpu] [--dst-gpu J] [--seed 0] [--out PATH.json]

For each shape, two processes are spawned (``multiprocessing`` spawn context), each allocating a
KV tensor of that shape (``executor.kernels.allocate_kv_cache``: layers, KV heads and head dim of
``horizon.model_shape.model_shape(name)``, or ``tiny``: ``executor.model.testing.tiny_config``;
``--num-blocks`` blocks of 16 tokens; bf16 on cuda, fp32 on cpu). The *source* fills its tensor
with seeded normal values and sends ``executor.kv_copy.share_kv`` bytes over a pipe; the
*destination* opens it (``open_kv``; the CUDA IPC open, timed once as ``open_s``) and times
``copy_blocks`` for each N of ``--sizes``: ``--warmup`` untimed then ``--repeats`` timed copies,
each of N distinct random source blocks into N distinct random destination blocks (numpy,
seeded). Each copy is timed two ways:

    seconds   on cuda: CUDA events recorded on a side stream just before the call and just after
              it (so they include the stream's wait for the host to enqueue the block-id copies
              and the two kernels: the cost of a transfer issued on an idle stream); on cpu: the
              host wall time
    wall_s    host wall time of the whole call up to the end event's completion (perf_counter)

Source and destination share one GPU (``cuda:0``) unless ``--dst-gpu J`` puts the destination's
tensor on ``cuda:J`` (two GPUs, peer copy). After the timed copies of a size, one more copy goes
into a zeroed destination and is checked exactly (``torch.equal``): the destination blocks equal
the source blocks and every other destination block is still zero.

The fit is ordinary least squares over the sizes' medians: ``seconds = latency + bytes /
bandwidth``; ``bytes`` is the payload (N blocks of every layer, K and V), not the HBM traffic
(on one GPU the gather and the scatter each read and write it once).

JSON written to ``--out`` (``format: "horizon.kv_transfer/1"``)::

    {"format", "date", "device", "torch", "triton", "numpy", "cuda", "python", "gpu",
     "options": {sizes, repeats, warmup, num_blocks, block_size, seed, dst_gpu},
     "timers": {"seconds": one line, "wall_s": one line},
     "shapes": {name: {"num_layers", "num_kv_heads", "head_dim", "block_size", "num_blocks",
                       "dtype", "bytes_per_block", "placement", "src_device", "dst_device",
                       "gpu", "dst_gpu_name", "share_s", "open_s",
                       "sizes": [{"blocks", "tokens", "bytes",
                                  "seconds": {"median", "p10", "p90"},
                                  "wall_s": {"median", "p10", "p90"},
                                  "samples": [s], "wall_samples": [s], "correct": bool}],
                       "fit": {"latency_s", "latency_us", "bandwidth_Bps", "bandwidth_GBps",
                               "r2", "timer": "seconds"},
                       "fit_wall": {same, "timer": "wall_s"}}}}

GB/s are 1e9 bytes per second; ``bandwidth_*`` is null when the fitted slope is not positive.
Every time is in seconds. A short table is printed last. Needs torch and numpy only.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import multiprocessing
import platform
import queue
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from executor.kernels import allocate_kv_cache
from executor.kv_copy import copy_blocks, open_kv, share_kv

FORMAT = "horizon.kv_transfer/1"
TINY = "tiny"
BLOCK_SIZE = 16
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PROCESS_TIMEOUT_S = 600.0
TIMERS = {
    "seconds": "cuda: CUDA events on the side stream around the call; cpu: host wall time",
    "wall_s": "host wall time of the call until the copy's end event completed",
}


@dataclass(frozen=True)
class Spec:
    """What the two spawned processes of one shape build and measure (plain, picklable)."""

    shape: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_blocks: int
    device: str  # "cuda" or "cpu"
    dst_gpu: int
    sizes: tuple[int, ...]
    repeats: int
    warmup: int
    seed: int
    block_size: int = BLOCK_SIZE

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.device == "cuda" else torch.float32

    def devices(self) -> tuple[torch.device, torch.device]:
        """(source tensor's device, destination tensor's device)."""
        if self.device == "cpu":
            return torch.device("cpu"), torch.device("cpu")
        return torch.device("cuda", 0), torch.device("cuda", self.dst_gpu)

    def bytes_per_block(self) -> int:
        elems = self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim
        return elems * self.dtype.itemsize


def shape_dims(name: str) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a ``horizon.model_shape`` preset or ``tiny``; unknown
    names raise ValueError listing the known ones."""
    if name == TINY:
        from executor.model.testing import tiny_config

        s = tiny_config().shape
    else:
        from horizon.model_shape import model_shape

        s = model_shape(name)
    return s.num_layers, s.num_kv_heads, s.head_dim


def _allocate(spec: Spec, device: torch.device) -> torch.Tensor:
    return allocate_kv_cache(
        spec.num_layers,
        spec.num_blocks,
        spec.block_size,
        spec.num_kv_heads,
        spec.head_dim,
        spec.dtype,
        device,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- the source process ------------------------------------------------------------------------
def source_main(spec: Spec, conn: Any) -> dict[str, Any]:
    """Allocate and fill the source KV tensor, send its ``share_kv`` bytes on ``conn``, then keep
    it alive until the destination says ``"done"``. Returns the sharing time."""
    device = spec.devices()[0]
    kv = _allocate(spec, device)
    g = torch.Generator(device=device).manual_seed(spec.seed)
    kv.normal_(generator=g)
    _sync(device)
    t0 = time.perf_counter()
    blob = share_kv(kv)
    share_s = time.perf_counter() - t0
    conn.send_bytes(blob)
    if conn.recv() != "done":
        raise RuntimeError("the destination did not finish")
    return {"share_s": share_s}


# -- the destination process -------------------------------------------------------------------
def _spread(values: list[float]) -> dict[str, float]:
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return {"median": float(median), "p10": float(p10), "p90": float(p90)}


def _timed_copy(
    src: torch.Tensor, dst: torch.Tensor, s: list[int], d: list[int], stream: Any
) -> tuple[float, float]:
    """One copy: (seconds by the spec's timer, host wall seconds)."""
    if dst.device.type == "cpu":
        t0 = time.perf_counter()
        copy_blocks(src, dst, s, d)
        wall = time.perf_counter() - t0
        return wall, wall
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record(stream)
    copy_blocks(src, dst, s, d, stream)
    end.record(stream)
    end.synchronize()
    wall = time.perf_counter() - t0
    return start.elapsed_time(end) / 1e3, wall


def check_copy(
    src: torch.Tensor, dst: torch.Tensor, s: list[int], d: list[int], stream: Any
) -> bool:
    """Copy ``s`` into a zeroed ``dst`` at ``d``; True iff those blocks equal the source's exactly
    and every other destination block is still zero."""
    dst.zero_()
    _sync(dst.device)
    event = copy_blocks(src, dst, s, d, stream)
    if event is not None:
        event.synchronize()
    d_idx = torch.tensor(d, device=dst.device)
    s_idx = torch.tensor(s, device=src.device)
    same = torch.equal(dst.index_select(2, d_idx), src.index_select(2, s_idx).to(dst.device))
    others = torch.ones(dst.shape[2], dtype=torch.bool, device=dst.device)
    others[d_idx] = False
    return same and not bool(dst[:, :, others].any())


def measure_size(
    src: torch.Tensor, dst: torch.Tensor, n: int, spec: Spec, rng: np.random.Generator, stream: Any
) -> dict[str, Any]:
    """``spec.warmup`` untimed and ``spec.repeats`` timed copies of ``n`` random blocks, then the
    exactness check; one entry of the JSON's ``sizes``."""

    def draw() -> tuple[list[int], list[int]]:
        pick = lambda: rng.choice(spec.num_blocks, size=n, replace=False).tolist()  # noqa: E731
        return pick(), pick()

    for _ in range(spec.warmup):
        _timed_copy(src, dst, *draw(), stream)
    samples, walls = [], []
    for _ in range(spec.repeats):
        seconds, wall = _timed_copy(src, dst, *draw(), stream)
        samples.append(seconds)
        walls.append(wall)
    return {
        "blocks": n,
        "tokens": n * spec.block_size,
        "bytes": n * spec.bytes_per_block(),
        "seconds": _spread(samples),
        "wall_s": _spread(walls),
        "samples": samples,
        "wall_samples": walls,
        "correct": check_copy(src, dst, *draw(), stream),
    }


def destination_main(spec: Spec, conn: Any) -> dict[str, Any]:
    """Allocate the destination KV tensor, open the source's (timed: ``open_s``), measure every
    size, release the source's tensor and tell the source ``"done"``. Returns the shape's
    measurements (the JSON's ``shapes[name]`` less the fits)."""
    src_device, device = spec.devices()
    dst = _allocate(spec, device)
    _sync(device)
    blob = conn.recv_bytes()
    t0 = time.perf_counter()
    src = open_kv(blob)
    _sync(src.device)
    open_s = time.perf_counter() - t0
    if src.device != src_device or src.shape != dst.shape:
        raise RuntimeError(f"opened {src.device} {tuple(src.shape)}, expected {src_device}")
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    rng = np.random.default_rng(spec.seed)
    sizes = [measure_size(src, dst, n, spec, rng, stream) for n in spec.sizes]
    del src
    _sync(device)
    conn.send("done")
    cuda = device.type == "cuda"
    return {
        "gpu": torch.cuda.get_device_name(src_device) if cuda else None,
        "dst_gpu_name": torch.cuda.get_device_name(device) if cuda else None,
        "open_s": open_s,
        "sizes": sizes,
    }


# -- spawning ----------------------------------------------------------------------------------
def _child(role: str, fn: Any, spec: Spec, conn: Any, results: Any) -> None:
    try:
        results.put((role, "ok", fn(spec, conn)))
    except BaseException:  # noqa: BLE001 - the parent must hear of any failure
        results.put((role, "error", traceback.format_exc()))


def run_pair(spec: Spec) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``source_main`` and ``destination_main`` in two spawned processes joined by a pipe.
    Returns (source result, destination result); raises RuntimeError with the traceback if either
    failed, died or ran past ``PROCESS_TIMEOUT_S``."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    a, b = ctx.Pipe()
    procs = {
        "source": ctx.Process(target=_child, args=("source", source_main, spec, a, results)),
        "destination": ctx.Process(
            target=_child, args=("destination", destination_main, spec, b, results)
        ),
    }
    for p in procs.values():
        p.start()
    got: dict[str, Any] = {}
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    try:
        while len(got) < 2:
            try:
                role, status, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in procs.items() if r not in got and not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    why = f"died ({dead})" if dead else f"ran past {PROCESS_TIMEOUT_S:.0f} s"
                    raise RuntimeError(f"kv transfer process {why}") from None
                continue
            if status != "ok":
                raise RuntimeError(f"the {role} process failed:\n{value}")
            got[role] = value
        for p in procs.values():
            p.join()
    finally:
        for p in procs.values():
            if p.is_alive():
                p.terminate()
                p.join()
    return got["source"], got["destination"]


# -- the report --------------------------------------------------------------------------------
def fit_line(nbytes: list[float], seconds: list[float], timer: str) -> dict[str, Any]:
    """Least squares ``seconds = latency + bytes / bandwidth`` (needs two distinct byte counts)."""
    x, y = np.asarray(nbytes, dtype=float), np.asarray(seconds, dtype=float)
    a = np.stack([np.ones_like(x), x], axis=1)
    (latency, slope), *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = y - a @ np.array([latency, slope])
    ss = float(((y - y.mean()) ** 2).sum())
    bw = 1.0 / slope if slope > 0 else None
    return {
        "latency_s": float(latency),
        "latency_us": float(latency) * 1e6,
        "bandwidth_Bps": bw,
        "bandwidth_GBps": bw / 1e9 if bw else None,
        "r2": 1.0 - float((resid**2).sum()) / ss if ss > 0 else None,
        "timer": timer,
    }


def _placement(spec: Spec) -> str:
    if spec.device == "cpu":
        return "cpu, two processes, shared memory"
    if spec.dst_gpu == 0:
        return "one GPU, two processes (CUDA IPC)"
    return f"two GPUs (cuda:0 -> cuda:{spec.dst_gpu}), two processes (CUDA IPC, peer copy)"


def measure_shape(spec: Spec) -> dict[str, Any]:
    """One shape's entry of the JSON's ``shapes``: both processes' results and the fits."""
    source, dest = run_pair(spec)
    src_device, dst_device = spec.devices()
    sizes = dest["sizes"]
    nbytes = [s["bytes"] for s in sizes]
    return {
        "num_layers": spec.num_layers,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "block_size": spec.block_size,
        "num_blocks": spec.num_blocks,
        "dtype": str(spec.dtype).removeprefix("torch."),
        "bytes_per_block": spec.bytes_per_block(),
        "placement": _placement(spec),
        "src_device": str(src_device),
        "dst_device": str(dst_device),
        "gpu": dest["gpu"],
        "dst_gpu_name": dest["dst_gpu_name"],
        "share_s": source["share_s"],
        "open_s": dest["open_s"],
        "sizes": sizes,
        "fit": fit_line(nbytes, [s["seconds"]["median"] for s in sizes], "seconds"),
        "fit_wall": fit_line(nbytes, [s["wall_s"]["median"] for s in sizes], "wall_s"),
    }


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_bench(opts: argparse.Namespace, log: Any = print) -> dict[str, Any]:
    """Measure every shape of ``opts`` (see ``parse_options``) and return the JSON document."""
    shapes = {}
    for name in opts.shape:
        layers, heads, dim = shape_dims(name)
        spec = Spec(
            shape=name,
            num_layers=layers,
            num_kv_heads=heads,
            head_dim=dim,
            num_blocks=opts.num_blocks,
            device=opts.device,
            dst_gpu=opts.dst_gpu,
            sizes=tuple(opts.sizes),
            repeats=opts.repeats,
            warmup=opts.warmup,
            seed=opts.seed,
        )
        log(f"{name}: {spec.bytes_per_block() / 1024:.0f} KiB per block, {_placement(spec)}")
        shapes[name] = measure_shape(spec)
    first = next(iter(shapes.values()))
    return {
        "format": FORMAT,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": opts.device,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "numpy": np.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "gpu": first["gpu"],
        "options": {
            "sizes": list(opts.sizes),
            "repeats": opts.repeats,
            "warmup": opts.warmup,
            "num_blocks": opts.num_blocks,
            "block_size": BLOCK_SIZE,
            "seed": opts.seed,
            "dst_gpu": opts.dst_gpu if opts.device == "cuda" else None,
        },
        "timers": TIMERS,
        "shapes": shapes,
    }


HEADER = (
    f"{'blocks':>7} {'tokens':>7} {'MiB':>8} {'median us':>10} {'p10 us':>9} {'p90 us':>9} "
    f"{'wall us':>9} {'GB/s':>7} ok"
)


def table(doc: dict[str, Any]) -> str:
    """The short table printed last: per shape, each size's medians and the fits."""
    lines = []
    for name, sh in doc["shapes"].items():
        lines.append(f"{name} ({sh['placement']}; open {sh['open_s'] * 1e3:.1f} ms)")
        lines.append(HEADER)
        for s in sh["sizes"]:
            t = s["seconds"]
            lines.append(
                f"{s['blocks']:>7} {s['tokens']:>7} {s['bytes'] / 2**20:>8.2f} "
                f"{t['median'] * 1e6:>10.1f} {t['p10'] * 1e6:>9.1f} {t['p90'] * 1e6:>9.1f} "
                f"{s['wall_s']['median'] * 1e6:>9.1f} {s['bytes'] / t['median'] / 1e9:>7.2f} "
                f"{'yes' if s['correct'] else 'NO'}"
            )
        for key in ("fit", "fit_wall"):
            f = sh[key]
            bw = f"{f['bandwidth_GBps']:.2f} GB/s" if f["bandwidth_GBps"] else "n/a (slope <= 0)"
            lines.append(
                f"  {key} ({f['timer']}): bandwidth {bw}, latency {f['latency_us']:.1f} us"
            )
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive ints, got {text!r}")
    return values


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring); exits with a usage error on bad values."""
    p = argparse.ArgumentParser(
        prog="python -m executor.kv_transfer_bench",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--shape", default="qwen2.5-0.5b", type=lambda t: [s for s in t.split(",") if s])
    p.add_argument("--sizes", default=list(DEFAULT_SIZES), type=_int_list)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--num-blocks", type=int, default=512)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dst-gpu", type=int, default=0, help="destination tensor's GPU (cuda only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    opts = p.parse_args(argv)
    if opts.repeats < 1 or opts.warmup < 0 or opts.dst_gpu < 0:
        p.error("--repeats must be >= 1, --warmup and --dst-gpu >= 0")
    if opts.num_blocks < max(opts.sizes):
        p.error(f"--num-blocks ({opts.num_blocks}) must be >= the largest size {max(opts.sizes)}")
    if len(set(opts.sizes)) < 2:
        p.error("--sizes needs at least two distinct sizes for the fit")
    for name in opts.shape:
        try:
            shape_dims(name)
        except ValueError as e:
            p.error(f"--shape: {e}")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_options(argv)
    if opts.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available (use --device cpu)")
        return 2
    try:
        doc = run_bench(opts)
    except RuntimeError as e:  # a spawned process failed: its traceback is in the message
        print(f"error: {e}")
        return 1
    if opts.out is not None:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    return 0 if all(s["correct"] for sh in doc["shapes"].values() for s in sh["sizes"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
