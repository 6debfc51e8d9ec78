"""Predictions made once for a known set of requests, replayed exactly elsewhere.

The learned predictor needs scikit-learn, the tokenizer and a 50 MB model; the GPU machine that
runs the engine need not have the tokenizer or the same scikit-learn. What its ``prepare``
computes for a run's requests (per request: the total-length distribution and the remaining
model's location and scale over tokens generated) is plain data. ``LearnedPredictor.
save_prepared(requests, path)`` writes it to a small file, and ``PreparedPredictor(path)``
answers ``predict``/``update`` for exactly those requests from it, through the same arithmetic
(``remaining_from_entry``, which the learned predictor's own ``update`` uses). A policy then
sees identical predictions on the simulator and on the engine.

File: gzip'd pickle of ``{"header": {...}, "entries": {request_id: Entry}}``; the header names
the format, its version, the predictor and artifact it came from, and the requests' count.
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import math
import os
import pickle
from array import array
from pathlib import Path

from horizon.prediction import LengthDistribution
from horizon.request import Request
from predictors.base import LEVELS, BasePredictor, check_generated, load_versioned
from predictors.calibration import ResidualQuantiles

PREPARED_FORMAT = "horizon-prepared-predictions"
PREPARED_VERSION = 1

# One request's entry: (num_prompt_tokens, max_output_tokens, total distribution, grid of g,
# the remaining model's location and scale of log remaining length at each grid point, the
# residual quantiles to use, stepwise: read the last grid point <= g instead of interpolating)
Entry = tuple[int, int, LengthDistribution, tuple[int, ...], array, array, ResidualQuantiles, bool]
DONE = LengthDistribution(LEVELS, tuple(1.0 for _ in LEVELS), 1.0, 1.0)


def remaining_from_entry(entry: Entry, g: int) -> LengthDistribution:
    """Remaining length after ``g`` tokens: the location and scale at ``g`` in the entry's
    table (interpolated, or the last point <= g when stepwise), with the residual quantiles of
    that band of ``g``; capped at ``max_output_tokens - g``. ``g = 0`` gives the total."""
    _, hi, total, grid, loc, scl, rz, stepwise = entry
    if g == 0:
        return total
    if g >= hi:  # at or past max_output_tokens: one more token is all that is left
        return DONE
    k = bisect.bisect_right(grid, g) - 1  # the last grid point <= g (grid[0] == 1 <= g)
    if stepwise or k >= len(grid) - 1:
        m, s = loc[k], scl[k]
    else:
        w = (g - grid[k]) / (grid[k + 1] - grid[k])
        m = loc[k] + w * (loc[k + 1] - loc[k])
        s = scl[k] + w * (scl[k + 1] - scl[k])
    cap = float(hi - g)
    top = 1.0
    vals = []
    for z in rz.row(g):
        v = math.exp(m + s * z)
        if v > cap:
            v = cap
        if v > top:
            top = v
        vals.append(top)
    return LengthDistribution(LEVELS, tuple(vals), 1.0, cap)


def check_entry(entry: Entry, request: Request, who: str) -> Entry:
    """``entry`` if it was made for a request of this prompt length and output limit."""
    if entry[0] != request.num_prompt_tokens or entry[1] != request.max_output_tokens:
        raise ValueError(
            f"{who}: request {request.request_id} differs from the one prepared under that id "
            f"(prompt {entry[0]} / limit {entry[1]} tokens, got {request.num_prompt_tokens} / "
            f"{request.max_output_tokens})"
        )
    return entry


def save_entries(entries: dict[int, Entry], header: dict, path: str | os.PathLike[str]) -> str:
    """Write a prepared-predictions file (parents created); returns its resolved path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "header": {
            **header,
            "format": PREPARED_FORMAT,
            "version": PREPARED_VERSION,
            "num_requests": len(entries),
        },
        "entries": entries,
    }
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(gzip.compress(pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL), 6))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return str(path.resolve())


class PreparedPredictor(BasePredictor):
    """Replays a prepared-predictions file (module docstring) for the requests it holds.

    Args:
        path: the file ``LearnedPredictor.save_prepared`` wrote.

    Raises:
        FileNotFoundError: no such file. ValueError: not a file of this format and version.
        ``predict``/``update`` raise ValueError for a request the file does not hold, or one
        whose prompt length or output limit differ from the prepared one.
    """

    name = "prepared"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        doc = load_versioned(
            p,
            lambda f: pickle.loads(gzip.decompress(f.read_bytes())),
            PREPARED_FORMAT,
            PREPARED_VERSION,
            "prepared",
            "prepared-predictions file",
        )
        header = doc["header"]
        self.header: dict = header
        self.path = str(p.resolve())
        self._entries: dict[int, Entry] = doc["entries"]
        self.check_integrity()

    def check_integrity(self) -> None:
        """Every entry is well formed: its grid starts at 1 and rises, its tables match it."""
        if self.header.get("num_requests") != len(self._entries):
            raise ValueError(f"prepared: {self.path} holds {len(self._entries)} entries, "
                             f"its header says {self.header.get('num_requests')}")  # fmt: skip
        for rid, e in self._entries.items():
            grid, loc, scl = e[3], e[4], e[5]
            if not grid or grid[0] != 1 or any(b <= a for a, b in zip(grid, grid[1:])):
                raise ValueError(f"prepared: request {rid}: grid must start at 1 and rise")
            if len(loc) != len(grid) or len(scl) != len(grid):
                raise ValueError(f"prepared: request {rid}: tables do not match the grid")

    def __len__(self) -> int:
        return len(self._entries)

    def digest(self) -> str:
        """SHA-256 of the predictions themselves: every entry's values, in request-id order
        (not the header, which names where the artifact lay, nor the pickle's bytes, which
        depend on which objects happened to be shared). Two files with the same digest make a
        policy decide alike."""
        h = hashlib.sha256()
        for rid in sorted(self._entries):
            n, hi, total, grid, loc, scl, rz, stepwise = self._entries[rid]
            plain = (rid, n, hi, total.levels, total.values, total.lo, total.hi, tuple(grid),
                     rz.levels, rz.g_edges, rz.table, rz.counts, bool(stepwise))  # fmt: skip
            h.update(repr(plain).encode())
            h.update(loc.tobytes())
            h.update(scl.tobytes())
        return h.hexdigest()

    def _entry(self, request: Request) -> Entry:
        e = self._entries.get(request.request_id)
        if e is None:
            raise ValueError(
                f"prepared: request {request.request_id} is not in {self.path} "
                f"({len(self._entries)} requests prepared)"
            )
        return check_entry(e, request, "prepared")

    def predict(self, request: Request) -> LengthDistribution:
        return self._entry(request)[2]

    def update(self, request: Request, tokens_so_far: int) -> LengthDistribution:
        check_generated(request, tokens_so_far)
        return remaining_from_entry(self._entry(request), tokens_so_far)
