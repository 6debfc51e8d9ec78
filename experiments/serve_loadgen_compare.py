"""GuideLLM's view of a run beside the server's own records and the simulator's replay.

``tabulate(DIR)`` reads what ``docs/notes/run_serve.sh a`` brings back (``guidellm_rate*.json``,
the server's ``records.npz`` and ``records.json``) and keeps, compactly, what the comparison
needs: ``results/serve_loadgen/requests.npz`` (each served request's arrival, lengths, cached
tokens, TTFT, mean and largest ITL, E2E; where the server left ``records.ttft.npz``, its TTFT's
split, ``experiments.serve_loadgen_split``) and ``guidellm.json`` (each benchmark's window and its
requests' TTFT, ITL and latency). ``compare()`` reads only those and writes
``results/serve_loadgen/{loadgen.json,table.md}``. Requests are split into the load generator's
benchmarks by their arrival on the server's clock (its zero as Unix time lines the two up).
Per rate and side: TTFT mean / p50 / p99, ITL as mean time per output token after the first
(GuideLLM reports no per-token times, so ITL is the per-request mean on every side),
E2E, and goodput as the share of requests with TTFT <= 1 s and mean ITL <= 50 ms; the server
and the simulator also give goodput with *every* gap <= 50 ms (the project's definition).

The simulator replays the server's arrivals, prompt lengths, output lengths and prompt ids
(the data file tokenized as the server did: Qwen's BPE, ChatML) in one run, as the server
served the rates one after the other on one KV pool (with prefix caching on, later rates hit
the cache of the earlier ones' identical prompts; ``tabulate(..., prefix_caching=False)``
states a server that ran with it off, and the replay turns it off too), with the 7B shape's
engine-fitted cost model, fcfs and the serial loop the server runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from experiments import serve_loadgen_split as ttft_split
from horizon.metrics.latency import e2e, max_itl, tpot, ttft
from horizon.metrics.records import RunRecords
from horizon.request import SLO, Request

OUT = Path("results/serve_loadgen")
SLO_7B = SLO(ttft=1.0, itl=0.05)
CALIBRATION = Path("calibration/h200_qwen2.5-7b_online.csv.gz")
DATA = Path("gpu_inputs/serve/sharegpt.jsonl")
# what the server served, by model: its description, the calibration the simulator prices its
# steps with (None: no cost model is fitted to that model, no simulator column) and the outputs
MODELS = {
    "qwen2.5-7b": (
        "qwen2.5-7b shape (seeded random weights), Qwen BPE",
        CALIBRATION,
        "output lengths forced",
    ),
    "smollm2-135m-instruct": (
        "SmolLM2-135M-Instruct (real weights from its GGUF file, its own BPE)",
        None,
        "output lengths forced: GuideLLM sends the reply lengths as max_tokens with ignore_eos",
    ),
}


def _stats(ttft_s: np.ndarray, itl_s: np.ndarray, e2e_s: np.ndarray) -> dict:
    ok = (ttft_s <= SLO_7B.ttft) & (np.nan_to_num(itl_s) <= SLO_7B.itl)
    return {
        "requests": int(len(ttft_s)),
        "ttft_mean": float(ttft_s.mean()),
        "ttft_p50": float(np.median(ttft_s)),
        "ttft_p99": float(np.percentile(ttft_s, 99)),
        "itl_mean": float(np.nanmean(itl_s)),
        "e2e_mean": float(e2e_s.mean()),
        "goodput_mean_itl": float(ok.mean()),
    }


def guidellm_rows(bench: dict) -> dict:
    """One GuideLLM benchmark, compactly: its rate, window (Unix s), error counts and its
    successful requests' TTFT, mean ITL and latency (s)."""
    reqs = bench["requests"]["successful"]
    return {
        "rate": bench["config"]["strategy"]["rate"],
        "start": bench["start_time"],
        "end": bench["end_time"],
        "errored": len(bench["requests"]["errored"]),
        "incomplete": len(bench["requests"]["incomplete"]),
        "ttft": [_us(r["time_to_first_token_ms"] / 1e3) for r in reqs],
        "itl": [_us(r["inter_token_latency_ms"] / 1e3) if r["inter_token_latency_ms"] else None
                for r in reqs],  # None: one token, no gap
        "latency": [_us(r["request_latency"]) for r in reqs],
    }  # fmt: skip


def _us(seconds: float) -> float:
    return round(seconds, 6)


def client_side(b: dict) -> dict:
    itl = np.array([np.nan if x is None else x for x in b["itl"]], dtype=float)
    out = _stats(np.array(b["ttft"]), itl, np.array(b["latency"]))
    out["errored"], out["incomplete"] = b["errored"], b["incomplete"]
    return out


def per_request(rec: RunRecords) -> dict[str, np.ndarray]:
    """What the comparison reads of a run's records, per request."""
    return {
        "arrival": rec.arrival_time,
        "prompt_tokens": rec.num_prompt_tokens,
        "output_tokens": rec.num_output_tokens,
        "max_output_tokens": rec.max_output_tokens,
        "cached_tokens": rec.cached_tokens,
        "ttft": ttft(rec),
        "itl_mean": tpot(rec),
        "itl_max": max_itl(rec),
        "e2e": e2e(rec),
    }


def records_side(r: dict[str, np.ndarray], select: np.ndarray) -> dict:
    """The same figures from per-request arrays (server or simulator) over ``select``."""
    out = _stats(r["ttft"][select], r["itl_mean"][select], r["e2e"][select])
    every = (r["ttft"] <= SLO_7B.ttft) & (np.nan_to_num(r["itl_max"]) <= SLO_7B.itl)
    out["goodput_every_gap"] = float(every[select].mean())
    return out


def prompt_ids(r: dict[str, np.ndarray], num_runs: int) -> list[tuple[int, ...]]:
    """Each served request's prompt ids: the data file's prompts in order (from its start
    again in each of ``num_runs`` runs), chat-templated and tokenized as the server does;
    checked against the records' prompt lengths."""
    from executor.serve.qwen_text import QwenText

    tok = QwenText()
    lines = [json.loads(x) for x in DATA.read_text().splitlines()]
    n_per_run = len(r["arrival"]) // num_runs
    order = np.argsort(r["arrival"], kind="stable")
    ids: list[tuple[int, ...] | None] = [None] * len(order)
    for k, i in enumerate(order):
        msg = [{"role": "user", "content": lines[k % n_per_run]["prompt"]}]
        ids[i] = tuple(tok.encode(tok.apply_chat_template(msg)))
    lengths = np.array([len(x) for x in ids])
    if not np.array_equal(lengths, r["prompt_tokens"]):
        raise ValueError("prompt lengths differ from the server's: arrival order is not file order")
    return ids


def simulate(
    r: dict[str, np.ndarray], num_blocks: int, block_size: int, num_runs: int, caching: bool
) -> RunRecords:
    """The simulator on the server's requests (see the module docstring)."""
    from horizon.policies import make_policy
    from horizon.scheduler_config import SchedulerConfig
    from simulator.engine_cost_model import EngineCostModel
    from simulator.simulation import Simulation

    n = len(r["arrival"])  # without a cache the ids do not matter (and a load generator's
    ids = prompt_ids(r, num_runs) if caching else [None] * n  # workers may reorder arrivals)
    reqs = [
        Request(i, float(r["arrival"][i]), int(r["prompt_tokens"][i]),
                int(r["max_output_tokens"][i]), int(r["output_tokens"][i]),
                prompt_token_ids=ids[i])
        for i in range(n)
    ]  # fmt: skip
    cfg = SchedulerConfig(
        num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=caching
    )
    cost = EngineCostModel.from_file(CALIBRATION)
    sim = Simulation(reqs, cfg, make_policy("fcfs"), cost, arrivals_at_step_boundaries=True,
                     pipelined=False)  # fmt: skip
    return sim.run()


def tabulate(
    run_dir: Path,
    out: Path = OUT,
    prefix_caching: bool = True,
    engine: str = "process",
    model: str = "qwen2.5-7b",
) -> None:
    """The compact tables of a run directory (see the module docstring); ``prefix_caching``,
    ``engine`` (process or thread) and ``model`` (a key of ``MODELS``) state how the server
    ran."""
    if model not in MODELS:
        raise ValueError(f"model: {model!r} is not one of {sorted(MODELS)}")
    rec = RunRecords.load_npz(str(run_dir / "records.npz"))
    zero = json.loads((run_dir / "records.json").read_text())["clock_zero_unix_s"]
    paths = sorted(run_dir.glob("guidellm_rate*.json"), key=lambda p: float(p.stem[13:]))
    docs = [json.loads(p.read_text()) for p in paths]
    out.mkdir(parents=True, exist_ok=True)
    split = ttft_split.columns(run_dir, rec, docs, zero)
    np.savez_compressed(out / "requests.npz", **per_request(rec), **split,
                        num_kv_blocks=rec.num_kv_blocks, block_size=rec.block_size)  # fmt: skip
    g = {"clock_zero_unix_s": zero, "guidellm_version": docs[0]["metadata"]["guidellm_version"],
         "server": {"prefix_caching": prefix_caching, "engine": engine, "model": model},
         "benchmarks": [guidellm_rows(d["benchmarks"][0]) for d in docs]}  # fmt: skip
    (out / "guidellm.json").write_text(json.dumps(g, separators=(",", ":")) + "\n")


def compare(out: Path = OUT) -> dict:
    z = np.load(out / "requests.npz")
    server = {k: z[k] for k in z.files if k not in ("num_kv_blocks", "block_size")}
    g = json.loads((out / "guidellm.json").read_text())
    nb, bs = int(z["num_kv_blocks"]), int(z["block_size"])
    caching = g["server"]["prefix_caching"]
    calibration = MODELS[g["server"].get("model", "qwen2.5-7b")][1]
    sim = None
    if calibration is not None:
        sim = per_request(simulate(server, nb, bs, len(g["benchmarks"]), caching))
    rows = []
    for b in g["benchmarks"]:
        t0, t1 = b["start"] - g["clock_zero_unix_s"], b["end"] - g["clock_zero_unix_s"]
        sel = (server["arrival"] >= t0 - 0.5) & (server["arrival"] <= t1 + 0.5)
        cached = server["cached_tokens"][sel].sum() / server["prompt_tokens"][sel].sum()
        rows.append(
            {
                "rate": b["rate"],
                "client": client_side(b),
                "server": records_side(server, sel),
                "cached_share": float(cached),
            }
        )
        if sim is not None:
            rows[-1]["sim"] = records_side(sim, sel)  # fmt: skip
        split = ttft_split.means(server, sel, rows[-1]["client"]["ttft_mean"])
        if split:
            rows[-1]["split"] = split
    result = {"conditions": _conditions(nb, g), "rows": rows}
    (out / "loadgen.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "table.md").write_text(table(result))
    print(table(result))
    return result


def _conditions(num_blocks: int, g: dict) -> dict:
    server, bench = g["server"], g["benchmarks"][0]
    per_rate = len(bench["ttft"]) + bench["errored"] + bench["incomplete"]
    engine = "its own process" if server["engine"] == "process" else "a thread of the server"
    caching = "on" if server["prefix_caching"] else "off"
    model, calibration, outputs = MODELS[server.get("model", "qwen2.5-7b")]
    sim = "none: no cost model is fitted to this model"
    if calibration is not None:
        sim = f"engine-fitted cost model ({calibration}), serial loop, the same arrivals"
    return {
        "engine": f"executor.serve, {model}, fcfs, the engine in {engine}, prefix caching "
        f"{caching}",
        "num_blocks": num_blocks,
        "load_generator": f"GuideLLM {g['guidellm_version']}, openai_http, /v1/chat/completions,"
        f" Poisson, seed 0, {per_rate} requests per rate, ShareGPT first turns ({outputs})",
        "slo": {"ttft_s": SLO_7B.ttft, "itl_s": SLO_7B.itl},
        "simulator": sim,
    }


def table(result: dict) -> str:
    """Markdown: one line per rate and side."""
    head = (
        "| rate | side | TTFT mean ms | p50 | p99 | ITL mean ms | E2E mean s | goodput "
        "(mean ITL) | goodput (every gap) |\n" + "|---" * 9 + "|\n"
    )
    lines = []
    for r in result["rows"]:
        for side in ("client", "server", "sim"):
            if side not in r:
                continue
            s = r[side]
            every = f"{s['goodput_every_gap']:.3f}" if "goodput_every_gap" in s else "-"
            lines.append(
                f"| {r['rate']:g} | {side} | {1e3 * s['ttft_mean']:.1f} | {1e3 * s['ttft_p50']:.1f}"
                f" | {1e3 * s['ttft_p99']:.1f} | {1e3 * s['itl_mean']:.2f} | {s['e2e_mean']:.2f}"
                f" | {s['goodput_mean_itl']:.3f} | {every} |"
            )
    return (
        "# GuideLLM against the server, beside its records and the simulator\n\n"
        + json.dumps(result["conditions"])
        + "\n\n"
        + head
        + "\n".join(lines)
        + "\n"
        + ttft_split.table(result["rows"])
    )
