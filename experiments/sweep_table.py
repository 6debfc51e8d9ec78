"""A sweep's runs packed into one file, ``<sweep dir>/runs.jsonl.gz``, and the runs read back.

    python -m experiments.sweep_table pack DIR     # every run directory under DIR -> the table
    python -m experiments.sweep_table unpack DIR   # the table -> the run directories, byte for byte

One JSON line per run directory, sorted: ``{"run": its path under DIR, "summary.json": the
file's text, "config.yaml": the file's text}`` (a committed sweep keeps its runs' summaries and
configs, not their records). Gzip without a name or timestamp: the same runs pack to the same
bytes. ``find_runs`` reads packed runs as if their directories were there, so tables and figures
(``experiments.results.load_results``) are the same from either; packing leaves the directories
in place (delete them once packed: their records are not in the table).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from experiments.run_dir import CONFIG, SUMMARY

TABLE = "runs.jsonl.gz"
PACKED = (SUMMARY, CONFIG)  # the files of a run directory the table holds


def pack(sweep_dir: str | Path) -> Path:
    """Write ``sweep_dir/runs.jsonl.gz`` from every run directory under ``sweep_dir``.

    Raises:
        ValueError: no run directory (holding a summary.json) under ``sweep_dir``.
    """
    sweep_dir = Path(sweep_dir)
    run_dirs = sorted(s.parent for s in sweep_dir.rglob(SUMMARY))
    if not run_dirs:
        raise ValueError(f"no {SUMMARY} under {sweep_dir}: nothing to pack")
    lines = []
    for d in run_dirs:
        row = {"run": d.relative_to(sweep_dir).as_posix()}
        files = [name for name in PACKED if (d / name).is_file()]
        row.update({name: (d / name).read_bytes().decode() for name in files})
        lines.append(json.dumps(row, sort_keys=True) + "\n")
    path = sweep_dir / TABLE
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write("".join(lines).encode())
    path.write_bytes(buf.getvalue())
    return path


def read_table(path: str | Path) -> list[dict]:
    """The rows of a packed table (``run``, and each packed file's text by its name)."""
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def unpack(sweep_dir: str | Path) -> list[Path]:
    """Write back the run directories of ``sweep_dir``'s table; returns them.

    Raises:
        FileExistsError: a file it would write is already there (nothing is overwritten).
    """
    sweep_dir = Path(sweep_dir)
    rows = read_table(sweep_dir / TABLE)
    targets = [sweep_dir / r["run"] / name for r in rows for name in PACKED if name in r]
    for t in targets:
        if t.exists():
            raise FileExistsError(f"{t} exists: unpack writes only run directories not there")
    for r in rows:
        (sweep_dir / r["run"]).mkdir(parents=True, exist_ok=True)
        for name in PACKED:
            if name in r:
                (sweep_dir / r["run"] / name).write_bytes(r[name].encode())
    return [sweep_dir / r["run"] for r in rows]


def find_runs(paths: Iterable[str | Path]) -> list[tuple[Path, dict]]:
    """``(run directory, its summary)`` for every run under ``paths``, sorted by directory:
    each directory holding a summary.json, and each run of a packed table below (standing for
    its directory; a directory that is there too is read instead).

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: no run was found.
    """
    paths = [Path(p) for p in paths]
    runs: dict[Path, dict] = {}
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"no such directory: {p}")
        for table in sorted(p.rglob(TABLE)):
            for row in read_table(table):
                runs[table.parent / row["run"]] = json.loads(row[SUMMARY])
    for p in paths:
        for s in sorted(p.rglob(SUMMARY)):
            runs[s.parent] = json.loads(s.read_bytes())
    if not runs:
        raise ValueError(f"no {SUMMARY} or {TABLE} under {', '.join(map(str, paths))}")
    return sorted(runs.items())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.sweep_table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=("pack", "unpack"))
    parser.add_argument("dir", type=Path, help="the sweep directory")
    args = parser.parse_args(argv)
    if args.action == "pack":
        print(pack(args.dir))
    else:
        print(f"{len(unpack(args.dir))} run directories under {args.dir}")


if __name__ == "__main__":
    main()
