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
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from simulator.engine_cost_model import Buckets, EngineCostModel, read_steps

FORMAT = "horizon-engine-cost-fit"
VERSION = 1


def fit_path(calibration: str | Path) -> Path:
    """Where the fit of ``calibration`` lives: ``<name>.fit.json`` beside it."""
    p = Path(calibration)
    return p.with_name(p.name.removesuffix(".gz").removesuffix(".csv") + ".fit.json")


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
    fd, tmp = tempfile.mkstemp(dir=artifact.parent, prefix=artifact.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the artifact from other users
    os.replace(tmp, artifact)
