"""Tables and figures of any set of run directories.

    python -m experiments.plot DIR [DIR ...] [--out OUT] [--rate R]

DIRs may be sweep directories, Hydra multirun directories or single runs: every ``summary.json``
(or packed ``runs.jsonl.gz``, ``experiments.sweep_table``) below them is a run. Writes into OUT
(default: the first DIR) ``table.csv``, ``table.md``, and per setting (model, GPU, KV blocks,
workload, SLO, ...) ``goodput_vs_load.png`` and, where the runs kept their records,
``latency_cdf.png`` (suffixed ``_<i>`` when the runs hold several settings).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.figures import choose_rate, goodput_figure
from experiments.latency_figure import latency_cdf_figure
from experiments.results import load_results, settings
from experiments.table import write_table


def report(
    paths: Sequence[str | Path], out_dir: str | Path, rate: float | None = None
) -> list[Path]:
    """Write the table and the figures of the runs under ``paths``; returns the files written.

    ``rate``: the load of the latency CDFs (default: ``figures.choose_rate``).
    """
    out_dir = Path(out_dir)
    results = load_results(paths)
    written = list(write_table(results, out_dir))
    groups = settings(results)
    for i, (setting, rows) in enumerate(groups):
        suffix = f"_{i}" if len(groups) > 1 else ""
        written.append(goodput_figure(setting, rows, out_dir / f"goodput_vs_load{suffix}.png"))
        if not all(Path(d).is_dir() for d in rows["records_dir"]):
            print(f"no records kept for {setting_name(setting)}: no latency CDF", file=sys.stderr)
            continue
        at, why = (rate, "chosen") if rate is not None else choose_rate(rows)
        path = out_dir / f"latency_cdf{suffix}.png"
        written.append(latency_cdf_figure(setting, rows, at, path, why))
    return written


def setting_name(setting: dict) -> str:
    return f"{setting['workload']} on {setting['num_blocks']} blocks"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.plot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="run, sweep or multirun directories")
    parser.add_argument("--out", type=Path, default=None, help="output directory (first DIR)")
    parser.add_argument("--rate", type=float, default=None, help="load of the latency CDFs")
    args = parser.parse_args(argv)
    for path in report(args.dirs, args.out or args.dirs[0], args.rate):
        print(path)


if __name__ == "__main__":
    main()
