"""A replica's start-up delay in the simulator, read from ``executor.cold_start``'s calibration.

The calibration (``python -m executor.cold_start --out cold_start.json``) times each phase of a
replica's cold start per model shape; this model sums the phases' medians. Only these fields
are read (the rest of the file is ignored)::

    {"phases": [phase, ...],                 every phase of a start, in order
     "byte_phases": [phase, ...],            those that scale with the weights' bytes
     "shapes": {name: {"weight_bytes": int,
                       "phases": {phase: {"median": seconds}}}}}

``delay(name)`` is a measured shape's start-up; ``extrapolate(weight_bytes)`` estimates an
unmeasured one from the nearest measured shape (see there: an extrapolation, and marked so);
``scaled(factor)`` stretches every delay, for studies of slower or faster start-ups.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class MeasuredShape:
    """One calibrated shape: its weights' bytes and each phase's median seconds."""

    name: str
    weight_bytes: int
    phases: Mapping[str, float]

    def __post_init__(self) -> None:
        where = f"shapes[{self.name!r}]"
        w = self.weight_bytes
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"{where}.weight_bytes must be an int >= 1, got {w!r}")
        for phase, v in self.phases.items():
            _seconds(v, f"{where}.phases.{phase}.median")


@dataclass(frozen=True)
class StartupBreakdown:
    """A replica's start-up delay, phase by phase (seconds, ``factor`` applied).

    Attributes:
        phases: seconds per phase, in the calibration's order; ``total`` is their sum.
        reference: the measured shape these figures come from.
        weight_bytes: the replica's weights.
        extrapolated: False for a measured shape. True for ``StartupModel.extrapolate``: then
            ``scaled_phases`` were scaled by ``byte_ratio`` from ``reference`` and every other
            phase is ``reference``'s as measured, an assumption, not a measurement.
        byte_ratio: ``weight_bytes`` over ``reference``'s (1.0 when measured).
        scaled_phases: the phases scaled by ``byte_ratio`` (empty when measured).
        factor: the model's ``scaled`` factor, applied to every phase.
    """

    phases: Mapping[str, float]
    reference: str
    weight_bytes: int
    extrapolated: bool
    byte_ratio: float
    scaled_phases: tuple[str, ...]
    factor: float

    @property
    def total(self) -> float:
        return sum(self.phases.values())


class StartupModel:
    """Start-up delays of replicas from measured shapes (see the module docstring).

    Args:
        shapes: the measured shapes; each must have every one of ``phases``.
        phases: every phase of a start-up, in order.
        byte_phases: the phases proportional to the weights' bytes (a subset of ``phases``).
        factor: multiplies every delay (> 0; ``scaled`` makes a model with another).

    Raises ValueError naming the field for an empty or inconsistent calibration.
    """

    def __init__(
        self,
        shapes: Sequence[MeasuredShape],
        phases: Sequence[str],
        byte_phases: Sequence[str],
        factor: float = 1.0,
    ) -> None:
        if not shapes:
            raise ValueError("shapes must hold at least one measured shape")
        if not phases or len(set(phases)) != len(phases):
            raise ValueError(f"phases must be distinct names, at least one, got {list(phases)!r}")
        extra = [p for p in byte_phases if p not in phases]
        if extra:
            raise ValueError(f"byte_phases {extra} are not in phases {list(phases)}")
        self.shapes: dict[str, MeasuredShape] = {}
        for s in shapes:
            if s.name in self.shapes:
                raise ValueError(f"shapes: {s.name!r} is given twice")
            if set(s.phases) != set(phases):
                raise ValueError(
                    f"shapes[{s.name!r}].phases must be exactly {list(phases)}, got "
                    f"{list(s.phases)}"
                )
            self.shapes[s.name] = s
        self.phases = tuple(phases)
        self.byte_phases = tuple(p for p in self.phases if p in byte_phases)
        self.factor = _factor(factor)

    @classmethod
    def from_calibration(cls, data: Mapping[str, Any]) -> StartupModel:
        """From ``executor.cold_start``'s JSON document (as a dict)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"calibration must be a JSON object, got {type(data).__name__}")
        phases = _names(data, "phases")
        byte_phases = _names(data, "byte_phases")
        shapes = data.get("shapes")
        if not isinstance(shapes, Mapping) or not shapes:
            raise ValueError("calibration field 'shapes' must be a non-empty object")
        return cls([_measured(n, s) for n, s in shapes.items()], phases, byte_phases)

    @classmethod
    def load(cls, path: str | Path) -> StartupModel:
        """From a calibration JSON file."""
        return cls.from_calibration(json.loads(Path(path).read_text()))

    def scaled(self, factor: float) -> StartupModel:
        """This model with every delay multiplied by ``factor`` (> 0; factors compose)."""
        shapes = list(self.shapes.values())
        return StartupModel(shapes, self.phases, self.byte_phases, self.factor * _factor(factor))

    def delay(self, shape_name: str) -> float:
        """Seconds from a replica's launch to its first token: the sum of the measured phases of
        ``shape_name`` (times ``factor``). Unknown names raise ValueError listing the known."""
        return self.breakdown(shape_name).total

    def breakdown(self, shape_name: str) -> StartupBreakdown:
        """``delay``'s phases (``extrapolated`` False)."""
        s = self.shapes.get(shape_name)
        if s is None:
            known = ", ".join(sorted(self.shapes))
            raise ValueError(f"shape_name {shape_name!r} was not measured; known: {known}")
        phases = {p: s.phases[p] * self.factor for p in self.phases}
        return StartupBreakdown(phases, s.name, s.weight_bytes, False, 1.0, (), self.factor)

    def extrapolate(self, weight_bytes: int) -> StartupBreakdown:
        """An EXTRAPOLATION for an unmeasured shape of ``weight_bytes``: from the measured shape
        nearest in bytes (smallest ``|log(bytes / measured bytes)|``, ties to the first name),
        the byte phases (load, host-to-device copy) scaled linearly by the bytes' ratio and the
        fixed phases (CUDA init, KV allocation, kernel compile and graphs, first step) kept as
        measured, which ignores how those grow with layers and width. The breakdown says so
        (``extrapolated``, ``reference``, ``byte_ratio``, ``scaled_phases``)."""
        w = weight_bytes
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"weight_bytes must be an int >= 1, got {w!r}")
        ref = min(
            sorted(self.shapes.values(), key=lambda s: s.name),
            key=lambda s: abs(math.log(w / s.weight_bytes)),
        )
        ratio = w / ref.weight_bytes
        phases = {
            p: ref.phases[p] * (ratio if p in self.byte_phases else 1.0) * self.factor
            for p in self.phases
        }
        return StartupBreakdown(phases, ref.name, w, True, ratio, self.byte_phases, self.factor)


def _seconds(v: Any, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{field} must be a finite number of seconds >= 0, got {v!r}")
    return float(v)


def _factor(f: Any) -> float:
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
        raise ValueError(f"factor must be a finite number > 0, got {f!r}")
    return float(f)


def _names(data: Mapping[str, Any], field: str) -> list[str]:
    v = data.get(field)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"calibration field {field!r} must be a list of phase names, got {v!r}")
    return v


def _measured(name: str, entry: Any) -> MeasuredShape:
    """One ``shapes`` entry of the calibration: its weight bytes and phase medians."""
    where = f"shapes[{name!r}]"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be an object, got {entry!r}")
    phases = entry.get("phases")
    if not isinstance(phases, Mapping):
        raise ValueError(f"{where}.phases must be an object of phase -> {{'median': s}}")
    medians = {}
    for phase, v in phases.items():
        if not isinstance(v, Mapping) or "median" not in v:
            raise ValueError(f"{where}.phases.{phase} must be an object with a 'median'")
        medians[phase] = _seconds(v["median"], f"{where}.phases.{phase}.median")
    weight_bytes = entry.get("weight_bytes")
    if weight_bytes is None:
        raise ValueError(f"{where} lacks field 'weight_bytes'")
    return MeasuredShape(name, weight_bytes, medians)
