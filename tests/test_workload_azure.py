"""Azure 2023 LLM inference trace CSVs: real files (when present) and malformed rows."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from horizon.workload.azure_trace import load_azure_trace

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CONV = DATA / "AzureLLMInferenceTrace_conv.csv.gz"
CODE = DATA / "AzureLLMInferenceTrace_code.csv.gz"
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def _real(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"{path} absent (Azure trace data lives outside the repo, ../shared/data)")
    return path


def _write(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = ("\r\n".join(lines) + "\r\n").encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_conv_trace():
    trace = load_azure_trace(_real(CONV))
    assert len(trace) == 19_366
    assert trace.context_tokens.mean() == pytest.approx(1154.7, abs=0.05)
    assert trace.generated_tokens.mean() == pytest.approx(211.1, abs=0.05)
    assert np.median(trace.context_tokens) == 1020 and np.median(trace.generated_tokens) == 129
    assert trace.times[0] == 0.0 and np.all(np.diff(trace.times) >= 0)
    # 18:15:46.6805900 -> 19:14:08.4025270 (last row)
    assert trace.times[1] == pytest.approx(50.9951690 - 46.6805900, abs=1e-9)
    assert trace.times[-1] == pytest.approx(58 * 60 + 21.7219370, abs=1e-6)
    assert trace.times.dtype == np.float64 and trace.context_tokens.dtype == np.int64


def test_code_trace():
    trace = load_azure_trace(_real(CODE))
    assert len(trace) == 8_819
    assert trace.context_tokens.mean() == pytest.approx(2047.8, abs=0.05)
    assert trace.generated_tokens.mean() == pytest.approx(27.9, abs=0.05)


@pytest.mark.parametrize("gz", [False, True])
def test_small_file_with_seven_fractional_digits(tmp_path, gz):
    path = _write(
        tmp_path / "t.csv",
        [
            HEADER,
            "2023-11-16 18:15:46.6805900,374,44",
            "2023-11-16 18:15:47.0000001,10,0",
            "2023-11-16 18:16:00,5,7",
        ],
        gz=gz,
    )
    trace = load_azure_trace(path)
    assert trace.times.tolist() == pytest.approx([0.0, 0.3194101, 13.31941], abs=1e-9)
    assert trace.context_tokens.tolist() == [374, 10, 5]
    assert trace.generated_tokens.tolist() == [44, 0, 7]
    assert trace.source == str(path.resolve())


def test_columns_are_found_by_name(tmp_path):
    path = _write(
        tmp_path / "t.csv", ["GeneratedTokens,TIMESTAMP,ContextTokens", "3,2023-11-16 18:15:46.5,9"]
    )
    trace = load_azure_trace(path)
    assert trace.context_tokens.tolist() == [9] and trace.generated_tokens.tolist() == [3]


@pytest.mark.parametrize(
    "row, field",
    [
        ("2023-11-16 18:15:4x.1,10,5", "TIMESTAMP"),
        ("2023-13-16 18:15:46.1,10,5", "TIMESTAMP"),  # month 13
        ("16/11/2023 18:15:46,10,5", "TIMESTAMP"),
        ("2023-11-16 18:15:47.1,-3,5", "ContextTokens"),
        ("2023-11-16 18:15:47.1,10,NaN", "GeneratedTokens"),
        ("2023-11-16 18:15:47.1,10.5,5", "ContextTokens"),
        ("2023-11-16 18:15:47.1,,5", "ContextTokens"),
        ("2023-11-16 18:15:47.1,10", "GeneratedTokens"),  # missing column
        ("2023-11-16 18:15:40.0,10,5", "TIMESTAMP"),  # goes back in time
    ],
)
def test_malformed_row_names_file_line_and_field(tmp_path, row, field):
    path = _write(tmp_path / "bad.csv", [HEADER, "2023-11-16 18:15:46.6805900,374,44", row])
    with pytest.raises(ValueError) as err:
        load_azure_trace(path)
    msg = str(err.value)
    assert str(path) in msg and "line 3" in msg and field in msg


def test_missing_header_column(tmp_path):
    path = _write(tmp_path / "bad.csv", ["TIMESTAMP,ContextTokens", "2023-11-16 18:15:46,1"])
    with pytest.raises(ValueError, match="line 1: missing column 'GeneratedTokens'"):
        load_azure_trace(path)


def test_empty_trace(tmp_path):
    with pytest.raises(ValueError, match="no rows"):
        load_azure_trace(_write(tmp_path / "h.csv", [HEADER]))
