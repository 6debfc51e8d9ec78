"""executor.kv_copy (copying KV blocks between replicas' KV tensors) and its benchmark, on the CPU.

Exactly the listed blocks move (every layer, K and V), across two spawned processes through
shared memory too; bad arguments are named in one-line ValueErrors; the benchmark's CPU path runs
end to end and fits a positive bandwidth.
"""

from __future__ import annotations

import json
import multiprocessing

import pytest
import torch

from executor.kernels import allocate_kv_cache
from executor.kv_copy import copy_blocks, open_kv, share_kv
from executor.kv_transfer_bench import fit_line, main, parse_options

LAYERS, BLOCK, HEADS, DIM = 3, 16, 2, 8


def kv(num_blocks: int, fill: bool = False) -> torch.Tensor:
    """A small KV tensor; ``fill``: every element distinct (its flat index + 1), else zeros."""
    t = allocate_kv_cache(LAYERS, num_blocks, BLOCK, HEADS, DIM, torch.float32, "cpu")
    if fill:
        t.copy_(torch.arange(1, t.numel() + 1, dtype=torch.float32).view(t.shape))
    return t


def assert_copied(src: torch.Tensor, dst: torch.Tensor, pairs: dict[int, int]) -> None:
    """dst block d == src block s for each ``s -> d`` of ``pairs``; every other dst block zero."""
    for s, d in pairs.items():
        assert torch.equal(dst[:, :, d], src[:, :, s]), (s, d)
    others = [b for b in range(dst.shape[2]) if b not in pairs.values()]
    assert not dst[:, :, others].any()


def test_copies_exactly_the_listed_blocks_every_layer_k_and_v():
    src, dst = kv(10, fill=True), kv(7)
    before = src.clone()
    assert copy_blocks(src, dst, [3, 0, 9], [5, 1, 2]) is None
    assert_copied(src, dst, {3: 5, 0: 1, 9: 2})
    assert torch.equal(src, before)
    # K and V of the last layer, not just the first: side 1 of layer 2 of dst block 5 is src's 3
    assert torch.equal(dst[2, 1, 5], before[2, 1, 3]) and dst[2, 1, 5].min() > 0


def test_ids_as_tensors_repeated_sources_and_in_place_swap():
    src, dst = kv(6, fill=True), kv(6)
    copy_blocks(src, dst, torch.tensor([4, 4]), torch.tensor([0, 3], dtype=torch.int32))
    assert torch.equal(dst[:, :, 0], src[:, :, 4]) and torch.equal(dst[:, :, 3], src[:, :, 4])
    before = src.clone()
    copy_blocks(src, src, [0, 1], [1, 0])  # the gather copies first, so a swap works
    assert torch.equal(src[:, :, 0], before[:, :, 1]) and torch.equal(src[:, :, 1], before[:, :, 0])
    assert torch.equal(src[:, :, 2:], before[:, :, 2:])
    copy_blocks(src, dst, [], [])  # nothing to do


@pytest.mark.parametrize(
    ("src", "dst", "src_blocks", "dst_blocks", "name"),
    [
        (kv(4), kv(4)[0], [0], [0], "dst_kv"),
        (kv(4).transpose(3, 4), kv(4), [0], [0], "src_kv"),
        ("not a tensor", kv(4), [0], [0], "src_kv"),
        (kv(4), kv(4).double(), [0], [0], "dst_kv"),
        (
            kv(4),
            allocate_kv_cache(LAYERS, 4, 8, HEADS, DIM, torch.float32, "cpu"),
            [0],
            [0],
            "dst_kv",
        ),
        (kv(4), kv(4), [4], [0], "src_blocks"),
        (kv(4), kv(9), [0], [-1], "dst_blocks"),
        (kv(4), kv(4), [0, 1], [0], "dst_blocks"),
        (kv(4), kv(4), [0, 1], [2, 2], "dst_blocks"),
        (kv(4), kv(4), [0.0], [0], "src_blocks"),
        (kv(4), kv(4), 0, [0], "src_blocks"),
        (kv(4), kv(4), [0], torch.tensor([[0]]), "dst_blocks"),
    ],
)
def test_validation_errors_name_the_argument(src, dst, src_blocks, dst_blocks, name):
    before = dst.clone() if isinstance(dst, torch.Tensor) else None
    with pytest.raises(ValueError, match=rf"^{name}: ") as e:
        copy_blocks(src, dst, src_blocks, dst_blocks)
    assert "\n" not in str(e.value)
    if before is not None:
        assert torch.equal(dst, before)  # nothing copied before the error


def test_stream_on_cpu_and_bad_share_and_open_are_named():
    with pytest.raises(ValueError, match="^stream: "):
        copy_blocks(kv(2), kv(2), [0], [1], stream=object())
    with pytest.raises(ValueError, match="^kv: "):
        share_kv(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="^blob: "):
        open_kv("not bytes")


# -- across two spawned processes through shared memory ----------------------------------------
PAIRS = {6: 0, 2: 4, 7: 3}


def _peer(conn) -> None:  # noqa: ANN001 - a multiprocessing Connection
    """The spawned peer: open the parent's KV tensor and copy its own blocks into it."""
    try:
        dst = open_kv(conn.recv_bytes())
        copy_blocks(kv(8, fill=True), dst, list(PAIRS), list(PAIRS.values()))
        conn.send("copied")
        conn.recv()  # keep going until the parent has checked
    except BaseException as e:  # noqa: BLE001 - report to the parent
        conn.send(f"error: {e!r}")


def test_copy_into_a_kv_tensor_shared_with_a_spawned_process():
    dst = kv(5)
    view = dst[1, 0]  # a view taken before sharing follows the storage into shared memory
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_peer, args=(theirs,), daemon=True)
    proc.start()
    try:
        ours.send_bytes(share_kv(dst))
        assert ours.poll(60), "the peer process did not answer"
        assert ours.recv() == "copied"
        assert dst.is_shared()
        assert_copied(kv(8, fill=True), dst, PAIRS)
        assert torch.equal(view[0], kv(8, fill=True)[1, 0, 6])
        ours.send("bye")
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join()


# -- the benchmark -----------------------------------------------------------------------------
def test_fit_line_recovers_latency_and_bandwidth():
    nbytes = [1e3, 1e6, 4e6]
    f = fit_line(nbytes, [20e-6 + b / 5e9 for b in nbytes], "seconds")
    assert f["latency_us"] == pytest.approx(20.0)
    assert f["bandwidth_GBps"] == pytest.approx(5.0)
    assert f["r2"] == pytest.approx(1.0)
    assert fit_line([1.0, 2.0], [2.0, 1.0], "seconds")["bandwidth_Bps"] is None


def test_bench_options_are_checked():
    with pytest.raises(SystemExit):
        parse_options(["--sizes", "1,600", "--num-blocks", "512"])
    with pytest.raises(SystemExit):
        parse_options(["--shape", "no-such-model"])
    assert parse_options(["--shape", "qwen2.5-0.5b,qwen2.5-7b"]).shape == [
        "qwen2.5-0.5b",
        "qwen2.5-7b",
    ]


def test_bench_cpu_end_to_end_writes_a_json_with_a_positive_bandwidth(tmp_path, capsys):
    out = tmp_path / "kv.json"
    argv = ["--device", "cpu", "--shape", "tiny", "--sizes", "1,256", "--repeats", "2"]
    assert main([*argv, "--warmup", "1", "--num-blocks", "300", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "horizon.kv_transfer/1" and doc["device"] == "cpu"
    assert doc["torch"] == torch.__version__ and doc["date"]
    sh = doc["shapes"]["tiny"]
    assert sh["bytes_per_block"] == 2 * 2 * 16 * 1 * 16 * 4  # layers, K+V, tokens, heads, dim, fp32
    assert [s["blocks"] for s in sh["sizes"]] == [1, 256]
    for s in sh["sizes"]:
        assert s["tokens"] == 16 * s["blocks"] and s["bytes"] == s["blocks"] * sh["bytes_per_block"]
        assert s["correct"] is True and len(s["samples"]) == 2
        assert 0 < s["seconds"]["p10"] <= s["seconds"]["median"] <= s["seconds"]["p90"]
    assert sh["open_s"] > 0
    assert sh["fit"]["bandwidth_GBps"] > 0 and sh["fit"]["bandwidth_Bps"] > 0
    assert "GB/s" in capsys.readouterr().out.splitlines()[-1]
