"""A third-party load generator (GuideLLM) against ``python -m executor.serve``: inputs and
the comparison of the client's figures with the server's own records and the simulator.

    python -m experiments.serve_loadgen prepare       # -> gpu_inputs/serve/sharegpt.jsonl
    bash docs/notes/run_serve.sh a                    # on the GPU machine
    python -m experiments.serve_loadgen tabulate DIR  # -> results/serve_loadgen/ (compact)
    python -m experiments.serve_loadgen compare       # -> results/serve_loadgen/table.md

``prepare`` writes ShareGPT first turns (text) with the reply's length in Qwen tokens as
``output_tokens_count`` (GuideLLM then sends ``max_tokens`` = that, ``ignore_eos``), in the
file's order; prompts of at most ``MAX_PROMPT`` and replies of at most ``MAX_OUTPUT`` tokens.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MAX_PROMPT = 2048
MAX_OUTPUT = 1024
INPUTS = Path("gpu_inputs/serve")


def prepare(out: Path = INPUTS, limit: int = 4000) -> Path:
    """The JSONL file of prompts and output lengths (``limit`` lines)."""
    from horizon.workload.sharegpt import ASSISTANT, USER, load_sharegpt
    from horizon.workload.tokenized import encode_text, load_tokenizer

    tok = load_tokenizer()
    corpus = load_sharegpt()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sharegpt.jsonl"
    n = 0
    with path.open("w") as f:
        for conv in corpus.conversations:
            if len(conv) < 2 or conv[0][0] != USER or conv[1][0] != ASSISTANT:
                continue
            prompt, reply = conv[0][1], conv[1][1]
            p, r = len(encode_text(tok, prompt)), len(encode_text(tok, reply))
            if not prompt.strip() or not 1 <= r <= MAX_OUTPUT or p > MAX_PROMPT:
                continue
            f.write(json.dumps({"prompt": prompt, "output_tokens_count": r}) + "\n")
            n += 1
            if n == limit:
                break
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m experiments.serve_loadgen")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare")
    tab = sub.add_parser("tabulate")
    tab.add_argument("dir", help="what run_serve.sh a (or c) brought back")
    tab.add_argument("--no-prefix-caching", action="store_true", help="the server ran so")
    tab.add_argument("--engine", default="process", choices=("process", "thread"))
    tab.add_argument("--model", default="qwen2.5-7b", help="the model the server ran")
    cmp = sub.add_parser("compare")
    for q in (tab, cmp):
        q.add_argument("--out", default="results/serve_loadgen", help="the compact tables")
    args = p.parse_args(argv)
    if args.cmd == "prepare":
        print(prepare())
        return
    from experiments.serve_loadgen_compare import compare, tabulate

    if args.cmd == "tabulate":
        tabulate(
            Path(args.dir), Path(args.out), not args.no_prefix_caching, args.engine, args.model
        )
    else:
        compare(Path(args.out))


if __name__ == "__main__":
    main()
