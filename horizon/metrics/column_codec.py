"""Lossless, compact encodings of numpy columns (what ``RunRecords.save_npz`` writes).

``encode_columns`` stores each column with the smallest (compressed) of the encodings that give
back its exact bytes and dtype, checked on the spot; ``decode_columns`` reverses them. No file
I/O here: the caller writes the arrays and the plan (JSON-able) and hands both back.

    raw     the array as it is: always possible, the fallback
    int     an integer column in the narrowest integer type that holds it
    index   a float column all of whose values are values of a sorted reference column (a
            token is out when its step ends): its positions there, -1 for NaN
    clock   a float column of times read off a nanosecond clock (``ns / 1e9 - origin``): the
            nanoseconds, and each time's exact correction on its grid of ``2**-exp`` seconds

Every integer array stored (an int column, positions, nanoseconds, corrections) is kept as
its values or as its running differences (mostly 1s for a token's step position), whichever
compresses smaller; the plan says which.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping

import numpy as np

_INT_TYPES = (np.int8, np.int16, np.int32, np.int64)
_MAX_CLOCK_S = 2.0**53 / 1e9  # nanoseconds beyond this would not convert to float exactly
_ARRAY_COST = 200  # bytes of headers one more array costs in an .npz (a zip member)
Encoded = tuple[dict[str, np.ndarray], dict]  # arrays to store, the plan's entry


def encode_columns(
    columns: Mapping[str, np.ndarray], references: Mapping[str, str]
) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """The arrays to store and the plan that ``decode_columns`` reads back.

    ``references`` maps a column to the column whose values it may index (tried with the other
    encodings); a referenced column is never itself index-encoded. The arrays are named after
    their column (``<name>`` and ``<name>.fix``). Columns are not mutated.
    """
    assert not set(references) & set(references.values()), "a reference may not index another"
    stored: dict[str, np.ndarray] = {}
    plan: dict[str, dict] = {}
    for name, column in columns.items():
        candidates: list[Encoded | None] = [_raw(name, column)]
        if column.ndim == 1 and column.dtype.kind == "i":
            candidates.append(_int(name, column))
        if column.ndim == 1 and column.dtype == np.float64:
            if name in references:
                candidates.append(_index(name, column, columns[references[name]], references))
            candidates.append(_clock(name, column))
        arrays, entry = min(
            (c for c in candidates if c is not None and _exact(name, c, column, columns)),
            key=lambda c: _stored_size(c[0]),
        )
        stored.update(arrays)
        plan[name] = entry
    return stored, plan


def decode_columns(stored: Mapping[str, np.ndarray], plan: Mapping[str, dict]) -> dict:
    """Every column of ``plan`` rebuilt from ``stored`` (index columns after their references).

    Raises:
        ValueError: the plan names an encoding this code does not know.
    """
    out: dict[str, np.ndarray] = {}
    for name in sorted(plan, key=lambda n: plan[n]["codec"] == "index"):
        entry = plan[name]
        if entry["codec"] not in _DECODERS:
            raise ValueError(f"column {name}: unknown encoding {entry['codec']!r}")
        out[name] = _DECODERS[entry["codec"]](name, stored, entry, out)
    return out


def _exact(
    name: str, candidate: Encoded, column: np.ndarray, columns: Mapping[str, np.ndarray]
) -> bool:
    arrays, entry = candidate
    back = _DECODERS[entry["codec"]](name, arrays, entry, columns)
    return (
        back.dtype == column.dtype
        and back.shape == column.shape
        and back.tobytes() == column.tobytes()
    )


def _stored_size(arrays: dict[str, np.ndarray]) -> int:
    return sum(
        _ARRAY_COST + len(zlib.compress(np.ascontiguousarray(a).tobytes())) for a in arrays.values()
    )


def _raw(name: str, column: np.ndarray) -> Encoded:
    return {name: column}, {"codec": "raw"}


def _int(name: str, column: np.ndarray) -> Encoded:
    arrays, ints = _pack_ints({name: column})
    return arrays, {"codec": "int", "dtype": column.dtype.str, "ints": ints}


def _index(
    name: str, column: np.ndarray, ref: np.ndarray, references: Mapping[str, str]
) -> Encoded | None:
    known = ~np.isnan(column)
    if ref.dtype != column.dtype or not np.all(ref[1:] >= ref[:-1]):
        return None
    if known.any() and not len(ref):
        return None
    pos = np.minimum(np.searchsorted(ref, column), max(len(ref) - 1, 0))
    arrays, ints = _pack_ints({name: np.where(known, pos, -1)})
    entry = {"codec": "index", "dtype": column.dtype.str, "of": references[name], "ints": ints}
    return arrays, entry


def _clock(name: str, column: np.ndarray) -> Encoded | None:
    if not (np.all(np.isfinite(column)) and np.all(np.abs(column) < _MAX_CLOCK_S)):
        return None
    exp = _grid_exponent(column)
    if exp is None:
        return None
    grid = (column * 2.0**exp).astype(np.int64)
    ns = np.rint(column * 1e9).astype(np.int64)
    arrays, ints = _pack_ints({name: ns, f"{name}.fix": grid - _on_grid(ns, exp)})
    return arrays, {"codec": "clock", "dtype": column.dtype.str, "exp": exp, "ints": ints}


def _grid_exponent(x: np.ndarray) -> int | None:
    """The smallest ``e`` with every ``x * 2**e`` a whole number below 2**62."""
    top = int(np.frexp(np.max(np.abs(x)))[1]) if len(x) else 0
    for exp in range(0, 62 - top + 1):
        scaled = x * 2.0**exp
        if np.array_equal(scaled, np.rint(scaled)):
            return exp
    return None


def _on_grid(ns: np.ndarray, exp: int) -> np.ndarray:
    # Deterministic IEEE arithmetic: the writer and the reader compute the same values.
    return np.rint(ns * (2.0**exp / 1e9)).astype(np.int64)


def _pack_ints(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Each integer array as its values or its running differences, in the narrowest type."""
    packed, modes = {}, {}
    for key, a in arrays.items():
        a = a.astype(np.int64)
        options = {"values": _narrow(a), "steps": _narrow(np.diff(a, prepend=0))}
        modes[key] = min(options, key=lambda m: _stored_size({key: options[m]}))
        packed[key] = options[modes[key]]
    return packed, modes


def _unpack_int(stored: Mapping[str, np.ndarray], key: str, entry: dict) -> np.ndarray:
    a = stored[key].astype(np.int64)
    return np.cumsum(a) if entry["ints"][key] == "steps" else a


def _narrow(a: np.ndarray) -> np.ndarray:
    for t in _INT_TYPES:
        if not len(a) or (a.min() >= np.iinfo(t).min and a.max() <= np.iinfo(t).max):
            return a.astype(t)
    return a


def _decode_raw(name, stored, entry, done) -> np.ndarray:
    return stored[name]


def _decode_int(name, stored, entry, done) -> np.ndarray:
    return _unpack_int(stored, name, entry).astype(np.dtype(entry["dtype"]))


def _decode_index(name, stored, entry, done) -> np.ndarray:
    pos, ref = _unpack_int(stored, name, entry), done[entry["of"]]
    out = np.full(len(pos), np.nan, dtype=np.dtype(entry["dtype"]))
    out[pos >= 0] = ref[pos[pos >= 0]]
    return out


def _decode_clock(name, stored, entry, done) -> np.ndarray:
    ns, exp = _unpack_int(stored, name, entry), entry["exp"]
    grid = _on_grid(ns, exp) + _unpack_int(stored, f"{name}.fix", entry)
    return (grid.astype(np.float64) * 2.0**-exp).astype(np.dtype(entry["dtype"]))


_DECODERS: dict[str, Callable] = {
    "raw": _decode_raw,
    "int": _decode_int,
    "index": _decode_index,
    "clock": _decode_clock,
}
