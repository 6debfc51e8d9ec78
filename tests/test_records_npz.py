"""RunRecords' .npz file: compact (format 2) and lossless, older files still read."""

from __future__ import annotations

import json
import zipfile
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
from test_metrics_build import make_records, synthetic_records

from horizon.metrics.column_codec import decode_columns, encode_columns
from horizon.metrics.records import NPZ_FORMAT, STEP_PLAN_COLUMNS, RunRecords

GOLDEN = Path(__file__).parent / "data" / "golden"


def engine_like(seed: int = 0, num_requests: int = 400, num_steps: int = 3000) -> RunRecords:
    """Records as the engine writes them: times read off a nanosecond clock minus its start,
    each token out at the end of a step, first admissions at a step's planning time."""
    rng = np.random.default_rng(seed)
    start_ns = 812_345_678_901  # the clock when the run started: perf_counter() is ns / 1e9

    def clock(ns: np.ndarray) -> np.ndarray:
        return (start_ns + ns) / 1e9 - start_ns / 1e9

    ends_ns = np.cumsum(rng.integers(4_000_000, 12_000_000, num_steps))
    step_end = clock(ends_ns)
    step_start = clock(ends_ns - rng.integers(3_000_000, 4_000_000, num_steps))  # sorted
    base = synthetic_records(num_requests, 20, seed=seed)
    n_tok = int(base.token_offsets[-1])
    token_steps = np.sort(rng.integers(0, num_steps, n_tok))
    admit = np.where(np.isnan(base.first_admit_time), np.nan, 0.0)
    admit[~np.isnan(admit)] = step_start[rng.integers(0, num_steps, int((~np.isnan(admit)).sum()))]
    steps = {c: rng.integers(0, 9, num_steps) for c in STEP_PLAN_COLUMNS}
    steps["prefill_attention_pairs"] = rng.integers(0, 2**40, num_steps)  # beyond int32
    return replace(
        base,
        token_times=step_end[token_steps],
        first_admit_time=admit,
        step_start=step_start,
        step_end=step_end,
        **{c: rng.integers(0, 500, num_steps) for c in ("prefill_tokens", "decode_tokens")},
        **{c: np.full(num_steps, 7, dtype=np.int32) for c in ("num_running", "num_waiting")},
        kv_used_blocks=rng.integers(0, 1000, num_steps),
        token_budget=np.full(num_steps, 2048),
        **steps,
    )


def _assert_same(a: RunRecords, b: RunRecords) -> None:
    assert a.digest() == b.digest()
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f.name


def _plan(path: Path) -> dict:
    with np.load(path) as z:
        assert int(z["format"]) == NPZ_FORMAT
        return json.loads(str(z["codecs"]))


def _member_sizes(path: Path) -> dict[str, int]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: i.compress_size for i in z.infolist()}


def _save_format_1(rec: RunRecords, path: Path, drop: tuple[str, ...] = ()) -> None:
    """What save_npz wrote before format 2: every field as it is."""
    arrays = {f.name: getattr(rec, f.name) for f in fields(rec) if f.name not in drop}
    arrays["reject_reason"] = np.array(rec.reject_reason, dtype=str)
    arrays["num_kv_blocks"] = np.array(rec.num_kv_blocks)
    arrays["block_size"] = np.array(rec.block_size)
    np.savez_compressed(path, **arrays)


def test_engine_records_round_trip_compact_and_byte_identical(tmp_path):
    rec = engine_like()
    rec.check()
    rec.save_npz(str(tmp_path / "new.npz"))
    _save_format_1(rec, tmp_path / "old.npz")
    back = RunRecords.load_npz(str(tmp_path / "new.npz"))
    _assert_same(rec, back)
    plan = _plan(tmp_path / "new.npz")
    assert plan["token_times"]["codec"] == "index" and plan["token_times"]["of"] == "step_end"
    assert plan["token_times"]["ints"] == {"token_times": "steps"}
    assert plan["first_admit_time"]["codec"] == "index"
    assert plan["step_end"]["codec"] == plan["step_start"]["codec"] == "clock"
    with np.load(tmp_path / "new.npz") as z:
        assert z["token_times"].dtype == np.int8  # the step positions' differences, 0 to 2
        assert z["prefill_attention_pairs"].dtype == np.int64  # does not fit in int32
    new, old = (_member_sizes(tmp_path / f) for f in ("new.npz", "old.npz"))
    assert new["token_times.npy"] < 0.1 * old["token_times.npy"]
    assert new["step_end.npy"] + new["step_end.fix.npy"] < 0.7 * old["step_end.npy"]


def test_token_times_off_the_steps_fall_back_exactly(tmp_path):
    rec = synthetic_records(2000, 20, seed=3)  # token times between step ends; int32 columns
    assert not np.isin(rec.token_times, rec.step_end).all()
    rec.save_npz(str(tmp_path / "r.npz"))
    assert _plan(tmp_path / "r.npz")["token_times"]["codec"] in ("raw", "clock")
    _assert_same(rec, RunRecords.load_npz(str(tmp_path / "r.npz")))


def test_empty_records_round_trip(tmp_path):
    rec = make_records([])
    rec.save_npz(str(tmp_path / "r.npz"))
    _assert_same(rec, RunRecords.load_npz(str(tmp_path / "r.npz")))


def test_format_1_files_still_load(tmp_path):
    rec = engine_like(seed=1)
    _save_format_1(rec, tmp_path / "v4.npz")
    _assert_same(rec, RunRecords.load_npz(str(tmp_path / "v4.npz")))
    _save_format_1(rec, tmp_path / "v2.npz", drop=STEP_PLAN_COLUMNS)  # before the plan columns
    old = RunRecords.load_npz(str(tmp_path / "v2.npz"))
    assert all((getattr(old, c) == -1).all() for c in STEP_PLAN_COLUMNS)
    assert old.token_times.tobytes() == rec.token_times.tobytes()


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.npz")))
def test_committed_format_1_goldens_convert_with_the_same_digest(tmp_path, name):
    rec = RunRecords.load_npz(str(GOLDEN / name))
    rec.save_npz(str(tmp_path / name))
    _assert_same(rec, RunRecords.load_npz(str(tmp_path / name)))


def test_unknown_format_is_refused(tmp_path):
    rec = engine_like(num_requests=5, num_steps=10)
    rec.save_npz(str(tmp_path / "r.npz"))
    with np.load(tmp_path / "r.npz") as z:
        arrays = {k: z[k] for k in z.files}
    np.savez_compressed(tmp_path / "r.npz", **{**arrays, "format": np.array(99)})
    with pytest.raises(ValueError, match="format 99 unknown"):
        RunRecords.load_npz(str(tmp_path / "r.npz"))


def test_codec_falls_back_where_an_encoding_would_change_bytes():
    columns = {
        "end": np.array([0.0, 0.5, 1.0]),
        "signed_zero": np.array([-0.0, 0.5, 1.0]),  # -0.0 == 0.0 but its bytes differ
        "nan_payload": np.frombuffer(np.array([0x7FF8_0000_0000_0001], np.uint64).tobytes()),
        "extremes": np.array([np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max]),
        "narrow": np.array([-3, 100, 7], dtype=np.int32),
    }
    refs = {"signed_zero": "end", "nan_payload": "end"}
    stored, plan = encode_columns(columns, refs)
    back = decode_columns(stored, json.loads(json.dumps(plan)))
    for name, col in columns.items():
        assert back[name].dtype == col.dtype and back[name].tobytes() == col.tobytes(), name
    assert plan["signed_zero"]["codec"] == "raw" and plan["nan_payload"]["codec"] == "raw"
    assert stored["narrow"].dtype == np.int8 and plan["narrow"]["dtype"] == "<i4"


def test_unknown_encoding_is_refused():
    with pytest.raises(ValueError, match="column x: unknown encoding 'zstd'"):
        decode_columns({"x": np.zeros(2)}, {"x": {"codec": "zstd"}})
