"""Field checks for frozen workload configs: each raises one ValueError naming ``Class.field``."""

from __future__ import annotations

import math
from collections.abc import Sequence


def _label(config: object, name: str) -> str:
    return f"{type(config).__name__}.{name}"


def is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_int(config: object, name: str, minimum: int, optional: bool = False) -> None:
    """``config.name`` is an int >= ``minimum`` (or None if ``optional``)."""
    v = getattr(config, name)
    if optional and v is None:
        return
    if not is_int(v) or v < minimum:
        none = " or None" if optional else ""
        raise ValueError(f"{_label(config, name)} must be an int >= {minimum}{none}, got {v!r}")


def check_number(
    config: object, name: str, allow_zero: bool = False, optional: bool = False
) -> None:
    """``config.name`` is a finite number > 0 (>= 0 if ``allow_zero``; or None if ``optional``)."""
    v = getattr(config, name)
    if optional and v is None:
        return
    if not is_number(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        none = " or None" if optional else ""
        raise ValueError(f"{_label(config, name)} must be a finite number {bound}{none}, got {v!r}")


def check_choice(config: object, name: str, known: Sequence[str]) -> None:
    v = getattr(config, name)
    if v not in known:
        raise ValueError(f"{_label(config, name)} must be one of {', '.join(known)}; got {v!r}")


def check_slo(config: object) -> None:
    """``slo_ttft`` and ``slo_itl``: finite seconds > 0, both or neither."""
    check_number(config, "slo_ttft", optional=True)
    check_number(config, "slo_itl", optional=True)
    if (config.slo_ttft is None) != (config.slo_itl is None):  # type: ignore[attr-defined]
        raise ValueError(
            f"{_label(config, 'slo_ttft')} and {_label(config, 'slo_itl')} must be given together"
        )
