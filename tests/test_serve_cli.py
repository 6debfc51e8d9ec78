"""``python -m executor.serve``'s options and its answer to an unknown model."""

from __future__ import annotations

from executor.serve.__main__ import engine_config, main, parse_args


def test_options_map_onto_the_engine_config():
    args = parse_args(["--model", "tiny", "--device", "cpu", "--num-blocks", "64"])
    cfg = engine_config(args, max_positions=256)
    assert (cfg.num_blocks, cfg.max_model_len, cfg.stop, cfg.max_num_seqs) == (64, 256, "eos", 256)
    args = parse_args(["--device", "cuda", "--max-model-len", "1024", "--no-cuda-graphs"])
    cfg = engine_config(args, max_positions=32768)
    assert cfg.num_blocks is None and cfg.max_model_len == 1024 and cfg.cuda_graphs is False


def test_an_unknown_model_is_refused(capsys):
    assert main(["--model", "no-such-model", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "tiny" in err
