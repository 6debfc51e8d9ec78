"""An engine replica's cold start, phase by phase, each measurement in a fresh spawned process.

    python -m executor.cold_start [--shapes qwen2.5-0.5b,qwen2.5-7b] [--repeats 3]
        [--device cuda|cpu] [--dtype bfloat16] [--num-blocks N] [--out PATH]

For each shape, a spawned *writer* process first writes the shape's seeded random weights
(``executor.bench.device_random_weights``, the cluster replicas' weights) as a HF-named
safetensors checkpoint (``executor.weights.save_safetensors``, shards of ``SHARD_BYTES``) into a
temporary directory (not timed; deleted after the shape's runs). Then each of ``--repeats`` runs
spawns a fresh process (``multiprocessing`` spawn context: nothing inherited, CUDA really cold)
that starts a replica as ``executor.cluster_worker.build_engine`` does, from that checkpoint,
timing with ``time.perf_counter`` (``torch.cuda.synchronize()`` at every phase boundary on CUDA)::

    process_start  from the parent's launch of the process to the end of the child's imports
                   (interpreter start, torch, triton, executor); perf_counter is CLOCK_MONOTONIC
                   on Linux, one clock for every process of the machine
    cuda_init      torch.cuda.init() and a tiny device allocation (on the CPU: a tiny allocation)
    weight_load    the checkpoint's tensors read from disk into host memory (memory-mapped,
                   copied out tensor by tensor); the files' pages are dropped from the OS page
                   cache before each run (fsync + posix_fadvise DONTNEED), so they come from disk
                   (--page-cache keep: from memory, as on a machine that just read them)
    h2d_copy       the model's parameters allocated on the device and every host tensor copied
                   into its place
    kv_alloc       the Engine built: the KV tensor (the pool the engine sizes from free memory,
                   or --num-blocks) and the runner's buffers
    warmup         Engine.warmup(): every decode and mixed-step CUDA graph captured, compiling
                   the Triton kernels first (each run gets an empty Triton cache unless
                   --triton-cache default); a no-op off CUDA graphs
    first_step     the first request served: one prefill of a FIRST_PROMPT_TOKENS-token prompt
                   emitting one token (scheduler and records included)

JSON written to ``--out`` (``format: "horizon.cold_start/1"``)::

    {"format", "date", "device", "dtype", "torch", "triton", "cuda", "gpu", "python",
     "phases": [the names above, in order], "byte_phases": ["weight_load", "h2d_copy"],
     "phase_doc": {phase: one line}, "options": {repeats, num_blocks, attention_backend,
     first_prompt_tokens, page_cache, triton_cache, tmp_dir, filesystem, shard_bytes},
     "shapes": {name: {"weight_bytes", "num_params", "num_files", "file_bytes", "write_s",
                       "num_blocks", "phases": {phase: {"median", "min", "max"}},
                       "total": {"median", "min", "max"},
                       "runs": [{"phases": {phase: s}, "total": s, "num_blocks",
                                 "page_cache_dropped"}]}}}

Every time is in seconds; a run's ``total`` is the sum of its phases (contiguous intervals, so
also the time from launch to the first token); the summary's ``total`` is over the runs' totals.
``weight_bytes`` are the bytes of the model's parameters (= the tensors read). ``byte_phases``
are those that scale with the weights' bytes (``simulator.startup_model`` reads this file).
A short table is printed last.

On the CPU (tests) use the ``tiny`` shape (``executor.model.testing.tiny_config``) and give
``--num-blocks``; ``--attention-backend triton`` there needs ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import queue
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FORMAT = "horizon.cold_start/1"
PHASE_DOC = {
    "process_start": "spawned process start and imports (torch, triton, executor)",
    "cuda_init": "torch.cuda.init() and a tiny device allocation",
    "weight_load": "checkpoint read from disk into host memory (page cache dropped first)",
    "h2d_copy": "parameters allocated on the device, host tensors copied in",
    "kv_alloc": "Engine built: KV tensor and the runner's buffers",
    "warmup": "Engine.warmup(): Triton compile and CUDA-graph capture",
    "first_step": "first request served: one short prefill emitting one token",
}
PHASES = tuple(PHASE_DOC)
BYTE_PHASES = ("weight_load", "h2d_copy")
SHAPES_DEFAULT = "qwen2.5-0.5b,qwen2.5-7b"
TINY = "tiny"
FIRST_PROMPT_TOKENS = 32
SHARD_BYTES = 4 << 30
WEIGHTS_SEED = 0
PAGE_CACHE = ("drop", "keep")
TRITON_CACHE = ("fresh", "default")


@dataclass(frozen=True)
class RunSpec:
    """What one spawned process builds (picklable, plain values).

    Attributes:
        shape: a preset name (``executor.model.preset_names``) or ``"tiny"``.
        device: "cuda" or "cpu".
        dtype: the weights' and KV cache's dtype (``executor.model.config.DTYPES``).
        num_blocks: KV blocks; None: the engine sizes the pool from free GPU memory.
        attention_backend: "triton", "torch" or None (the engine's choice).
        checkpoint: the checkpoint directory (written by ``write_checkpoint``).
    """

    shape: str
    device: str
    dtype: str
    num_blocks: int | None
    attention_backend: str | None
    checkpoint: str


def model_config(shape: str):  # noqa: ANN201 - ModelConfig; executor.model imports torch
    """The ``ModelConfig`` of a preset name or ``"tiny"`` (the tests' small decoder)."""
    from executor.model import ModelConfig
    from executor.model.testing import tiny_config

    return tiny_config() if shape == TINY else ModelConfig.for_preset(shape)


def shape_names() -> list[str]:
    """Every shape ``--shapes`` accepts."""
    from executor.model import preset_names

    return [*preset_names(), TINY]


# -- the writer process (not timed) ------------------------------------------------------------
def write_checkpoint(spec: RunSpec) -> dict[str, Any]:
    """Write ``spec.shape``'s seeded random weights into ``spec.checkpoint`` (drawn on
    ``spec.device``, in ``spec.dtype``), fsync them, and return their figures. Raises ValueError
    naming ``--tmp-dir`` when its disk lacks the room."""
    import torch

    from executor.bench import device_random_weights
    from executor.model import CausalLM
    from executor.weights import save_safetensors

    t0 = time.perf_counter()
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here")
    cfg = model_config(spec.shape)
    model = CausalLM(cfg, device=spec.device, dtype=getattr(torch, spec.dtype))
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    free = shutil.disk_usage(spec.checkpoint).free
    if free < nbytes + (256 << 20):
        raise ValueError(
            f"--tmp-dir {Path(spec.checkpoint).parent}: {free / 2**30:.1f} GiB free, the "
            f"{spec.shape} checkpoint needs {nbytes / 2**30:.1f} GiB"
        )
    device_random_weights(model, WEIGHTS_SEED)
    files = save_safetensors(model, spec.checkpoint, max_shard_bytes=SHARD_BYTES)
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped from the page cache
        finally:
            os.close(fd)
    return {
        "weight_bytes": nbytes,
        "num_params": sum(p.numel() for p in model.parameters()),
        "num_files": len(files),
        "file_bytes": sum(f.stat().st_size for f in files),
        "write_s": time.perf_counter() - t0,
    }


def drop_page_cache(directory: str | Path) -> bool:
    """Ask the OS to drop the cached pages of every file in ``directory`` (they are clean after
    ``write_checkpoint``'s fsync); False where ``posix_fadvise`` does not exist."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for f in sorted(Path(directory).iterdir()):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


# -- the measured process -----------------------------------------------------------------------
class PhaseClock:
    """Contiguous phase intervals from ``start``: ``mark(name)`` ends the current phase now
    (after ``sync()``, which waits for the device) and begins the next."""

    def __init__(self, start: float) -> None:
        self.phases: dict[str, float] = {}
        self.sync: Callable[[], None] = lambda: None
        self._last = start

    def mark(self, name: str) -> None:
        self.sync()
        now = time.perf_counter()
        self.phases[name] = now - self._last
        self._last = now


def measure(spec: RunSpec, launch: float) -> dict[str, Any]:
    """One cold start of ``spec``'s replica (in a fresh process launched at ``launch``, a
    ``perf_counter`` reading of its parent): every phase of ``PHASES`` in seconds, the engine's
    KV blocks, the bytes of weights read, and the versions and device this ran with."""
    import torch
    import triton

    from executor.engine import Engine, EngineConfig
    from executor.weights import hf_parameter_map

    clock = PhaseClock(launch)
    clock.mark("process_start")
    device = torch.device(spec.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available here")
        torch.cuda.init()
        clock.sync = torch.cuda.synchronize
    torch.ones(1, device=device)
    clock.mark("cuda_init")
    host = read_checkpoint(spec.checkpoint)
    clock.mark("weight_load")
    cfg = model_config(spec.shape)
    model = to_device(host, cfg, hf_parameter_map(cfg), device, getattr(torch, spec.dtype))
    clock.mark("h2d_copy")
    engine = Engine(
        model,
        EngineConfig(
            num_blocks=spec.num_blocks,
            # the default, or the model's positions when fewer (the tiny shape's)
            max_model_len=min(EngineConfig.max_model_len, cfg.max_position_embeddings),
            attention_backend=spec.attention_backend,
        ),
    )
    clock.mark("kv_alloc")
    engine.warmup()
    clock.mark("warmup")
    first_step(engine)
    clock.mark("first_step")
    read = sum(t.numel() * t.element_size() for t in host.values())
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert read == params, f"read {read} bytes of weights, the model has {params}"
    return {
        "phases": clock.phases,
        "num_blocks": engine.num_blocks,
        "weight_bytes": params,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }


def read_checkpoint(directory: str | Path):  # noqa: ANN201 - dict[str, torch.Tensor]
    """Every tensor of the checkpoint in ``directory``, copied into host memory (HF names)."""
    from executor.model.safetensors_io import SafetensorsFile
    from executor.weights import checkpoint_files

    host = {}
    for path in checkpoint_files(directory):
        f = SafetensorsFile(path)
        for name in f.names():  # in file order: the reads are sequential
            host[name] = f.get(name).clone()
    return host


def to_device(host, config, mapping, device, dtype):  # noqa: ANN001, ANN201
    """A ``CausalLM`` of ``config`` on ``device`` with the HF-named ``host`` tensors copied
    into its parameters (``mapping``: ``executor.weights.hf_parameter_map(config)``)."""
    import torch

    from executor.model import CausalLM

    model = CausalLM(config, device=device, dtype=dtype)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, target in mapping.items():
            target.view(params[target.param]).copy_(host[name])
    return model


def first_step(engine) -> None:  # noqa: ANN001 - executor.engine.Engine
    """Serve one request: a ``FIRST_PROMPT_TOKENS``-token prompt, one output token."""
    from horizon.request import Request

    request = Request(0, 0.0, FIRST_PROMPT_TOKENS, 1, 1)
    engine.run_offline([request])
    assert len(engine.outputs[0]) == 1, "the first request did not emit exactly one token"


# -- spawning ----------------------------------------------------------------------------------
def _child(fn: Callable[..., dict], results: Any, args: tuple) -> None:
    try:
        results.put(("ok", fn(*args)))
    except BaseException:  # noqa: BLE001 - the parent must hear of any failure
        results.put(("error", traceback.format_exc()))


def spawned(fn: Callable[..., dict], *args: Any, env: dict[str, str] | None = None) -> dict:
    """``fn(*args, launch)`` in a fresh spawned process, ``launch`` being the parent's
    ``perf_counter`` just before the start, with ``env`` added to its environment. Returns its
    result; raises RuntimeError carrying its traceback if it failed or died."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with _environ(env or {}):
        launch = time.perf_counter()
        proc = ctx.Process(target=_child, args=(fn, results, (*args, launch)))
        proc.start()
    try:
        while True:
            try:
                status, value = results.get(timeout=1.0)
                break
            except queue.Empty:
                if not proc.is_alive():
                    raise RuntimeError(
                        f"{fn.__name__} process died with exit code {proc.exitcode}"
                    ) from None
        proc.join()
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join()
    if status != "ok":
        raise RuntimeError(f"{fn.__name__} failed in its process:\n{value}")
    return value


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _write(spec: RunSpec, launch: float) -> dict[str, Any]:
    return write_checkpoint(spec)


# -- the parent: shapes, repeats, summary -------------------------------------------------------
@dataclass(frozen=True)
class Options:
    """The command line's choices (see ``main``)."""

    shapes: tuple[str, ...]
    repeats: int = 3
    device: str = "cuda"
    dtype: str = "bfloat16"
    num_blocks: int | None = None
    attention_backend: str | None = None
    page_cache: str = "drop"
    triton_cache: str = "fresh"
    tmp_dir: str | None = None


def measure_shape(shape: str, opts: Options, log: Callable[[str], None]) -> dict[str, Any]:
    """Write ``shape``'s checkpoint into a temporary directory, cold-start it ``opts.repeats``
    times (one spawned process each), delete the directory, and return the shape's entry of
    the JSON (module docstring) plus the runs' environment under ``"env"``."""
    with tempfile.TemporaryDirectory(prefix="horizon-cold-start-", dir=opts.tmp_dir) as tmp:
        ckpt = Path(tmp) / "checkpoint"
        ckpt.mkdir()
        spec = RunSpec(
            shape, opts.device, opts.dtype, opts.num_blocks, opts.attention_backend, str(ckpt)
        )
        written = spawned(_write, spec)
        log(
            f"{shape}: wrote {written['file_bytes'] / 2**30:.2f} GiB in "
            f"{written['num_files']} file(s), {written['write_s']:.1f} s (not timed)"
        )
        runs = []
        for i in range(opts.repeats):
            dropped = opts.page_cache == "drop" and drop_page_cache(ckpt)
            env = {}
            if opts.triton_cache == "fresh":
                env["TRITON_CACHE_DIR"] = str(Path(tmp) / f"triton-cache-{i}")
            run = spawned(measure, spec, env=env)
            run["total"] = sum(run["phases"].values())
            run["page_cache_dropped"] = dropped
            runs.append(run)
            log(f"{shape} run {i + 1}/{opts.repeats}: {_phase_line(run)}")
    env_keys = ("torch", "triton", "cuda", "gpu")
    return {
        **written,
        "num_blocks": runs[-1]["num_blocks"],
        "phases": {p: _spread([r["phases"][p] for r in runs]) for p in PHASES},
        "total": _spread([r["total"] for r in runs]),
        "runs": [
            {k: r[k] for k in ("phases", "total", "num_blocks", "page_cache_dropped")} for r in runs
        ],
        "env": {k: runs[0][k] for k in env_keys},
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _phase_line(run: dict) -> str:
    parts = ", ".join(f"{p} {run['phases'][p]:.2f}" for p in PHASES)
    return f"total {run['total']:.2f} s ({parts})"


def cold_start(opts: Options, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every shape of ``opts`` measured (``measure_shape``): the JSON document (module
    docstring)."""
    tmp = opts.tmp_dir or tempfile.gettempdir()
    fs = filesystem_of(tmp)
    log(f"checkpoints under {tmp} ({fs or 'unknown filesystem'})")
    if fs in ("tmpfs", "ramfs"):
        log("note: that filesystem is memory, so weight_load reads no disk; give --tmp-dir")
    shapes = {s: measure_shape(s, opts, log) for s in opts.shapes}
    env = next(iter(shapes.values())).pop("env")
    for entry in shapes.values():
        entry.pop("env", None)
    return {
        "format": FORMAT,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": opts.device,
        "dtype": opts.dtype,
        **env,
        "python": platform.python_version(),
        "phases": list(PHASES),
        "byte_phases": list(BYTE_PHASES),
        "phase_doc": PHASE_DOC,
        "options": {
            **{k: v for k, v in asdict(opts).items() if k not in ("shapes", "tmp_dir")},
            "first_prompt_tokens": FIRST_PROMPT_TOKENS,
            "shard_bytes": SHARD_BYTES,
            "tmp_dir": tmp,
            "filesystem": fs,
        },
        "shapes": shapes,
    }


def filesystem_of(path: str | Path) -> str | None:
    """The type of the filesystem holding ``path`` (from /proc/mounts; None elsewhere): a
    ``tmpfs`` there means the "disk" reads come from memory."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    best, kind = "", None
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def table(doc: dict[str, Any]) -> str:
    """The short table: per shape, each phase's median, the total's median [min, max] and the
    weights' GiB."""
    cols = [*PHASES, "total"]
    head = f"{'shape':<14}{'GiB':>7}" + "".join(f"{c:>14}" for c in cols) + f"{'min-max':>16}"
    lines = [head]
    for name, s in doc["shapes"].items():
        med = [s["phases"][p]["median"] for p in PHASES] + [s["total"]["median"]]
        spread = f"{s['total']['min']:.2f}-{s['total']['max']:.2f}"
        lines.append(
            f"{name:<14}{s['weight_bytes'] / 2**30:>7.2f}"
            + "".join(f"{v:>14.3f}" for v in med)
            + f"{spread:>16}"
        )
    return "\n".join(lines)


# -- command line ------------------------------------------------------------------------------
def parse_options(argv: list[str] | None = None) -> tuple[Options, str | None]:
    """``(Options, --out)`` from the command line; a bad option exits with a one-line error
    naming it (argparse's ``error``)."""
    from executor.model.config import DTYPES

    p = argparse.ArgumentParser(
        prog="python -m executor.cold_start", description=__doc__.splitlines()[0]
    )
    p.add_argument("--shapes", default=SHAPES_DEFAULT, help="comma-separated; 'tiny' for tests")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="bfloat16 on cuda, else float32")
    p.add_argument("--num-blocks", type=int, default=None, help="default: the engine's sizing")
    p.add_argument("--attention-backend", choices=("triton", "torch"), default=None)
    p.add_argument("--page-cache", choices=PAGE_CACHE, default="drop")
    p.add_argument("--triton-cache", choices=TRITON_CACHE, default="fresh")
    p.add_argument("--tmp-dir", default=None, help="where checkpoints are written (a disk)")
    p.add_argument("--out", default=None, help="JSON path")
    a = p.parse_args(argv)
    shapes = tuple(s.strip() for s in a.shapes.split(",") if s.strip())
    known = shape_names()
    unknown = [s for s in shapes if s not in known]
    if not shapes or unknown or len(set(shapes)) != len(shapes):
        p.error(f"--shapes must name distinct shapes of {', '.join(known)}; got {a.shapes!r}")
    if a.repeats < 1:
        p.error(f"--repeats must be >= 1, got {a.repeats}")
    if a.num_blocks is not None and a.num_blocks < 1:
        p.error(f"--num-blocks must be >= 1, got {a.num_blocks}")
    if a.device == "cpu" and a.num_blocks is None:
        p.error("--num-blocks is required with --device cpu (the engine sizes pools on a GPU)")
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if a.device == "cpu" and a.attention_backend == "triton" and not interpreted:
        p.error("--attention-backend triton with --device cpu needs TRITON_INTERPRET=1")
    if a.tmp_dir is not None and not Path(a.tmp_dir).is_dir():
        p.error(f"--tmp-dir {a.tmp_dir!r} is not a directory")
    if a.out is not None and not Path(a.out).resolve().parent.is_dir():
        p.error(f"--out {a.out!r}: its directory does not exist")
    dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    opts = Options(
        shapes, a.repeats, a.device, dtype, a.num_blocks, a.attention_backend,
        a.page_cache, a.triton_cache, a.tmp_dir,
    )  # fmt: skip
    return opts, a.out


def main(argv: list[str] | None = None) -> int:
    opts, out = parse_options(argv)
    try:
        doc = cold_start(opts, log=lambda line: print(line, flush=True))
    except RuntimeError as e:  # a spawned process failed: its traceback is in the message
        print(f"cold_start: {e}", file=sys.stderr)
        return 1
    if out is not None:
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out}")
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
