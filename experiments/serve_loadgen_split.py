"""GuideLLM's TTFT against the server's records, split into where its milliseconds go.

The server's ``--records`` run leaves beside its records the first tokens' moments on the server
(``records.ttft.npz``, ``executor.serve.ttft_trace``); GuideLLM's per-request timings give the
client's start (its first header write) and its first content read, and name each response's id.
Lined up, per request::

    client TTFT = in_send + in_body + TTFT (records) + ttft_out + text_wait + out_read

``in_send``: GuideLLM's start to the endpoint's start (its sending, the kernel, uvicorn's
parsing, routing); ``in_body``: the body read; ``ttft_out`` = ``out_pipe`` (the engine's
after-step work, its pipe, the reader thread's wake-up) + ``out_text`` (detokenization, stop
strings) + ``out_loop`` (the event loop's wake-up) + ``out_write`` (the handler's turn, the
chunk, uvicorn's send); ``text_wait``: to the first chunk with text (GuideLLM's first token);
``out_read``: that chunk written to GuideLLM's reading it. ``columns`` makes these per request of
the records (for ``requests.npz``), ``means`` per benchmark (ms), ``table`` the Markdown.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from horizon.metrics.records import RunRecords

# receipt_lag (<= 0): the records' arrival before the receipt, for a request that joined a plan
# whose clock was read before it came (``ttft_trace.split``): part of the way in
SERVER = ("in_body", "receipt_lag", "out_pipe", "out_text", "out_loop", "out_write", "ttft_out",
          "text_wait")  # fmt: skip
CLIENT = ("in_send", "out_read")
TRACE = "records.ttft.npz"


def columns(run_dir: Path, rec: RunRecords, docs: list[dict], zero: float) -> dict:
    """Per request of ``rec`` (its rows' order, seconds, NaN where unknown): ``SERVER``'s parts
    and ``CLIENT``'s ends from GuideLLM's ``docs`` (its results, one per rate) whose Unix times
    ``zero`` (the records' clock zero) lines up; {} when the run left no trace."""
    from executor.serve.ttft_trace import client_split, load_npz, split

    path = run_dir / TRACE
    if not path.exists():
        return {}
    trace = load_npz(str(path))
    parts = split(trace, rec)
    out = {k: parts[k] for k in SERVER}
    ids, start, first = [], [], []
    for doc in docs:
        for r in doc["benchmarks"][0]["requests"]["successful"]:
            t = r["info"]["timings"]
            if r.get("response_id") and t.get("request_start") and t.get("first_token_iteration"):
                ids.append(r["response_id"])
                start.append(t["request_start"] - zero)
                first.append(t["first_token_iteration"] - zero)
    ends = client_split(
        trace, np.array(ids, dtype=str), np.array(start), np.array(first), first_is_text=True
    )
    hit = ends["request_id"] >= 0
    row = np.searchsorted(rec.request_id, ends["request_id"][hit])
    for k in CLIENT:
        col = np.full(rec.num_requests, np.nan)
        col[row] = ends[k][hit]
        out[k] = col
    return out


def means(r: dict[str, np.ndarray], select: np.ndarray, client_ttft: float) -> dict:
    """Means (ms) over ``select`` of every part, the way in and the way out, and what the sum
    leaves of the client's mean TTFT (``client_ttft``, s): 0 when every request is matched."""
    if "ttft_out" not in r:
        return {}
    out = {k: 1e3 * float(np.nanmean(r[k][select])) for k in (*SERVER, *CLIENT)}
    out["ttft"] = 1e3 * float(np.nanmean(r["ttft"][select]))
    out["way_in"] = out["in_send"] + out["in_body"] + out["receipt_lag"]
    out["way_out"] = out["ttft_out"] + out["text_wait"] + out["out_read"]
    out["matched"] = int(np.sum(~np.isnan(r["in_send"][select])))
    out["left"] = 1e3 * client_ttft - out["ttft"] - out["way_in"] - out["way_out"]
    return out


def table(rows: list[dict]) -> str:
    """Markdown, one line per rate with a split (``rows``: ``compare``'s, each with a
    ``split`` of ``means``); "" when none has one."""
    lines = [
        f"| {r['rate']:g} | {1e3 * r['client']['ttft_mean']:.2f} | {s['ttft']:.2f} "
        f"| {s['in_send']:.2f} | {s['in_body']:.2f} | {s['receipt_lag']:.2f} "
        f"| {s['out_pipe']:.2f} | {s['out_text']:.2f} "
        f"| {s['out_loop']:.2f} | {s['out_write']:.2f} | {s['text_wait']:.2f} "
        f"| {s['out_read']:.2f} | {s['left']:.2f} | {s['matched']} |"
        for r in rows
        if (s := r.get("split"))
    ]
    if not lines:
        return ""
    head = (
        "\n## TTFT split (means, ms): client = records + way in (send, body, lag) + way out "
        "(pipe, text, loop, write, text wait, read)\n\n"
        "| rate | client | records | send | body | lag | pipe | text | loop | write | text wait "
        "| read | left | matched |\n" + "|---" * 14 + "|\n"
    )
    return head + "\n".join(lines) + "\n"
