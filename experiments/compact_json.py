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


def dumps(obj: object, digits: int = 6) -> str:
    """``obj`` as compact JSON (``rounded``), one line and a newline."""
    return json.dumps(rounded(obj, digits), sort_keys=True, separators=(",", ":")) + "\n"
