"""The tensor-parallel cost model's prediction for a shape's decode, per TP size (print only).

For each world size: one rank's weight bytes and their read time (the per-rank weight-read
roofline issue 22's step 4a measures against), and the predicted decode ms/step at each
batch (every sequence reading ``--context`` tokens of KV), split into the rank's roofline,
the all-reduces' latency and their bandwidth time. Unfitted: the coefficients are the
model's defaults (no TP steps measured yet).

    python -m experiments.tp_roofline [--model qwen2.5-7b] [--link nvlink] [--context 1024]
"""

from __future__ import annotations

import argparse
import sys

from horizon.model_shape import model_shape
from simulator.gpu import gpu_spec
from simulator.tp_cost_model import TensorParallelCostModel


def row(model: TensorParallelCostModel, batch: int, context: int) -> str:
    shape = (0, batch, batch * context, 0, 0, 0)
    rank, latency, nbytes = model.terms(*shape)
    total = model.time_for(*shape)
    return (
        f"  batch {batch:>3}: {total * 1e3:6.3f} ms/step (rank roofline {rank * 1e3:.3f}, "
        f"all-reduce latency {latency * 1e3:.3f}, bytes {nbytes * 1e3:.3f}, "
        f"overhead {model.overhead_s * 1e3:.3f})"
    )


def report(model_name: str, gpu: str, link: str, context: int, worlds, batches) -> list[str]:  # noqa: ANN001
    shape, spec = model_shape(model_name), gpu_spec(gpu)
    out = [f"{model_name} on {gpu} over {link}, decode with {context} tokens of context each"]
    for w in worlds:
        try:
            m = TensorParallelCostModel(shape, spec, world=w, link=link)
        except ValueError as e:
            out.append(f"TP={w}: not splittable ({e})")
            continue
        out.append(
            f"TP={w}: {m.rank_weight_bytes / 1e9:.2f} GB of weights per rank, read in "
            f"{m.weight_read_s * 1e3:.3f} ms (the per-rank weight-read roofline); "
            f"{m.num_all_reduces} all-reduces per step"
        )
        out += [row(m, b, context) for b in batches]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.tp_roofline")
    p.add_argument("--model", default="qwen2.5-7b")
    p.add_argument("--gpu", default="H200")
    p.add_argument("--link", default="nvlink")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    a = p.parse_args(argv)
    try:
        lines = report(a.model, a.gpu, a.link, a.context, a.worlds, a.batches)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
