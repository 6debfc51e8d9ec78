"""A report's JSON written compactly: floats to a number of significant digits, sorted keys, no
indentation. Results files are committed, and 17-digit floats of simulated figures carry no
information past the sixth.
"""

from __future__ import annotations

import json


def rounded(obj: object, digits: int = 6) -> object:
    """``obj`` with every float rounded to ``digits`` significant digits (containers copied)."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj


def dumps(
    obj: object, digits: int | None = 6, sort_keys: bool = True, exact: tuple[str, ...] = ()
) -> str:
    """``obj`` as compact JSON, one line and a newline: floats ``rounded`` to ``digits``
    significant digits (``None``: every float exactly as it is, only the whitespace goes) but
    under the keys ``exact`` of ``obj`` (a dict then: settings such as ``conditions``, kept as
    they were set), keys sorted unless ``sort_keys`` is false (then in the order a page
    rendered from the file lists them)."""
    out = obj if digits is None else rounded(obj, digits)
    if exact:
        assert isinstance(obj, dict) and isinstance(out, dict), "exact keys need a dict"
        out = {k: obj[k] if k in exact else v for k, v in out.items()}
    return json.dumps(out, sort_keys=sort_keys, separators=(",", ":")) + "\n"
