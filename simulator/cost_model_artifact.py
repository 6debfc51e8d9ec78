"""The engine-fitted cost model as an explicit artifact: fitted once per calibration file.

Fitting ``EngineCostModel`` to a calibration file takes 1-2 s (iteratively reweighted least
squares over ~50-150k steps), several times what simulating a run takes. The fitted model is
therefore kept beside its calibration file::

    calibration/h200_qwen2.5-7b_online.csv.gz     measured steps (input)
    calibration/h200_qwen2.5-7b_online.fit.json   the model fitted to them (this module)

The artifact names the SHA-256 of the calibration bytes it was fitted to. ``load_fitted``
uses it when that digest matches, and otherwise fits and writes it again (atomically, so that
parallel sweep workers never read half a file). Coefficients are stored as JSON floats, which
round-trip exactly: a loaded model times every plan as the freshly fitted one does. A run's
summary records both files and their digests (``EngineCostModel.provenance``).

The physical model (``simulator.physical_cost_model``) is kept the same way, in
``<name>.physical.fit.json`` (``load_physical``): its fit also depends on the model shape and
on the profiler grid beside the file (``physical_cost_model.grid_path``), which the artifact
names (the grid's SHA-256, or null where there is none).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from simulator.clock_state import ClockTable
from simulator.engine_cost_model import Buckets, EngineCostModel, read_steps
from simulator.physical_cost_model import PhysicalCostModel, grid_path

FORMAT = "horizon-engine-cost-fit"
VERSION = 1
PHYSICAL_FORMAT = "horizon-physical-cost-fit"
PHYSICAL_VERSION = 6  # 2: the compute side, the grid; 3: the longest walk; 4: floor, clock;
# 5: the decode buckets' offsets; 6: the decodes' walk is their longest, not their mean


def fit_path(calibration: str | Path) -> Path:
    """Where the fit of ``calibration`` lives: ``<name>.fit.json`` beside it."""
    p = Path(calibration)
    return p.with_name(p.name.removesuffix(".gz").removesuffix(".csv") + ".fit.json")


def physical_fit_path(calibration: str | Path) -> Path:
    """Where the physical model's fit of ``calibration`` lives: ``<name>.physical.fit.json``."""
    p = fit_path(calibration)
    return p.with_name(p.name.removesuffix(".fit.json") + ".physical.fit.json")


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_fitted(calibration: str | Path, residuals: bool = False) -> EngineCostModel:
    """The model fitted to ``calibration``, from its artifact if that matches the file's bytes,
    else fitted now (and the artifact written). ``residuals``: also keep the calibration steps'
    measured/modelled ratios (what ``with_noise`` needs; reads the steps).

    Raises:
        ValueError: the calibration file is missing or malformed (the message names it).
    """
    calibration = Path(calibration)
    if not calibration.exists():
        read_steps(calibration)  # its ValueError names the file and what to do
    digest = sha256_of(calibration)
    artifact = fit_path(calibration)
    model = _read(artifact, digest)
    if model is None:
        model = EngineCostModel.from_file(calibration)
        _write(artifact, model, calibration.name, digest)
    if residuals:
        model = model.with_residuals(read_steps(calibration)[0])
    provenance = {
        "calibration": str(calibration),
        "calibration_sha256": digest,
        "fit": str(artifact),
        "fit_sha256": sha256_of(artifact),
    }
    return replace(model, provenance=provenance)


def _read(artifact: Path, digest: str) -> EngineCostModel | None:
    """The model in ``artifact`` if it was fitted to the bytes of ``digest``, else None."""
    if not artifact.exists():
        return None
    try:
        doc = json.loads(artifact.read_text())
    except json.JSONDecodeError:
        return None  # a damaged artifact is fitted again
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        return None
    if doc.get("calibration_sha256") != digest:
        return None
    return EngineCostModel(
        decode_coef=tuple(doc["decode_coef"]),
        mixed_coef=tuple(doc["mixed_coef"]),
        buckets=Buckets(**doc["buckets"]),
        knee=doc["knee"],
        meta=doc["meta"],
    )


def _write(artifact: Path, model: EngineCostModel, source: str, digest: str) -> None:
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "calibration": source,
        "calibration_sha256": digest,
        "decode_coef": list(model.decode_coef),
        "mixed_coef": list(model.mixed_coef),
        "buckets": asdict(model.buckets),
        "knee": model.knee,
        "meta": model.meta,
    }
    _write_doc(artifact, doc)


def _write_doc(artifact: Path, doc: dict) -> None:
    """``doc`` as ``artifact``, written whole then renamed (parallel readers never see half)."""
    fd, tmp = tempfile.mkstemp(dir=artifact.parent, prefix=artifact.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the artifact from other users
    os.replace(tmp, artifact)


def load_physical(
    calibration: str | Path,
    model: str,
    kv_floor: float = 0.0,
    clock: ClockTable | None = None,
    bucket_min_steps: int = 0,
) -> PhysicalCostModel:
    """``PhysicalCostModel`` fitted to ``calibration`` for the shape ``model`` (``kv_floor``,
    ``bucket_min_steps`` and ``clock``, a table read from its duty-cycle file: as
    ``PhysicalCostModel.from_file``'s,
    the clock's slowdown taken out of the steps; the caller wraps the result in a
    ``ClockStateCost``), from its artifact (``physical_fit_path``) if that names this file's
    bytes, this shape, this floor, the clock file's bytes and the offsets' rule, else fitted
    now (and the artifact written).

    Raises:
        ValueError: the calibration file is missing or malformed (the message names it).
    """
    calibration = Path(calibration)
    if not calibration.exists():
        read_steps(calibration)  # its ValueError names the file and what to do
    if clock is not None and clock.source is None:
        raise ValueError("clock: a ClockTable read from its file (ClockTable.from_duty_cycle)")
    grid = grid_path(calibration)
    key = {
        "calibration_sha256": sha256_of(calibration),
        "grid_sha256": sha256_of(grid) if grid.exists() else None,
        "model": model,
        "kv_floor": float(kv_floor),
        "clock_sha256": None if clock is None else sha256_of(clock.source),
        "bucket_min_steps": int(bucket_min_steps),
    }
    artifact = physical_fit_path(calibration)
    found = _read_physical(artifact, key)
    if found is None:
        found = PhysicalCostModel.from_file(
            calibration, model, float(kv_floor), clock, int(bucket_min_steps)
        )
        doc = {
            "format": PHYSICAL_FORMAT,
            "version": PHYSICAL_VERSION,
            "calibration": calibration.name,
            **key,
            "clock": None if clock is None else Path(clock.source).name,
            "coef": list(found.coef),
            "decode_offsets": list(found.decode_offsets),
            "kv_bytes_per_token": found.kv_bytes_per_token,
            "tflops": list(found.tflops),
            "buckets": asdict(found.buckets),
            "meta": found.meta,
        }
        _write_doc(artifact, doc)
    provenance = {
        "calibration": str(calibration),
        "calibration_sha256": key["calibration_sha256"],
        "fit": str(artifact),
        "fit_sha256": sha256_of(artifact),
        **({} if clock is None else {"clock": clock.source, "clock_sha256": key["clock_sha256"]}),
    }
    return replace(found, provenance=provenance)


def _read_physical(artifact: Path, key: dict) -> PhysicalCostModel | None:
    """The model in ``artifact`` if it was fitted as ``key`` says (calibration and grid bytes,
    shape, KV floor, clock file bytes)."""
    if not artifact.exists():
        return None
    try:
        doc = json.loads(artifact.read_text())
    except json.JSONDecodeError:
        return None  # a damaged artifact is fitted again
    if (doc.get("format"), doc.get("version")) != (PHYSICAL_FORMAT, PHYSICAL_VERSION):
        return None
    if any(doc.get(k) != v for k, v in key.items()):
        return None
    return PhysicalCostModel(
        coef=tuple(doc["coef"]),
        kv_bytes_per_token=doc["kv_bytes_per_token"],
        buckets=Buckets(**doc["buckets"]),
        tflops=tuple(doc["tflops"]),
        kv_floor=doc["kv_floor"],
        meta=doc["meta"],
        decode_offsets=tuple(doc["decode_offsets"]),
    )
