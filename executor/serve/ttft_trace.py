"""Where a streamed request's first token spends its time on the server: the moments of its
way out, beside the records' TTFT (which ends at the engine's first token).

A client's TTFT ends when it reads the first token's chunk; the records' ends when the engine
read the token back. Between them lie the token's way out, which the server stamps here, and
the request's way in before its receipt, which only the client sees. Per streamed request
(``time.perf_counter()``, one clock for the machine's processes)::

    handler    the endpoint starts (routing done, body not yet read)
    receipt    its body has been read: the records' arrival
    (first)    the engine read its first token back: the records' first token time
    received   the server's reader thread took the step's message from the engine's pipe
               (an engine on a thread of the server: the same moment as ``posted``)
    posted     its text made, handed to the event loop (``call_soon_threadsafe``)
    delivered  the loop put it in the request's queue
    written    the chunk carrying it was handed to the response's send (uvicorn's write of it
               then lies in the client's ``out_read``)
    text_written   the first chunk with text was (what GuideLLM counts as the first token;
               later than ``written`` when the first token completes no character)

``split`` lines these up with the run's records: ``ttft`` (the records', unchanged) +
``ttft_out`` (+ ``receipt_lag``, ``split``'s) = ``written - receipt``, and ``ttft_out`` =
``out_pipe + out_text + out_loop + out_write``. A client's TTFT is then the records' TTFT +
``ttft_out`` + its way in (what neither the records nor these stamps see: the client's own
sending and reading, the kernel, and the server's HTTP parsing before the endpoint starts),
which ``client_split`` measures where a client's timings name their responses' ids:
``in_send`` before the endpoint starts, ``out_read`` after the chunk is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from horizon.metrics.latency import first_token_time
from horizon.metrics.records import RunRecords

NAN = math.nan
STAMPS = ("handler", "receipt", "received", "posted", "delivered", "written", "text_written")
# per-request figures of ``split`` (seconds), each the difference of two moments
SPLIT = {
    "in_body": ("handler", "receipt"),  # the body read (and the endpoint's own start)
    "out_pipe": ("first", "received"),  # the engine's after-step work, the pipe, the reader
    "out_text": ("received", "posted"),  # events unpacked, detokenized, stop strings
    "out_loop": ("posted", "delivered"),  # the loop's wake-up: what it was busy with
    "out_write": ("delivered", "written"),  # the handler's turn, the chunk, uvicorn's send
    "ttft_out": ("first", "written"),  # the four above
    "text_wait": ("written", "text_written"),  # first token's chunk to the first text
}


@dataclass(slots=True)
class FirstToken:
    """One streamed request's moments (see the module docstring); NaN until stamped."""

    request_id: int
    response_id: str
    handler: float
    receipt: float
    received: float = NAN
    posted: float = NAN
    delivered: float = NAN
    written: float = NAN
    text_written: float = NAN


class TtftTrace:
    """The ``FirstToken`` of every streamed request whose first token was written, on the
    event loop's thread (no locks)."""

    def __init__(self) -> None:
        self._rows: list[FirstToken] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, first: FirstToken) -> None:
        """A request's first token was written (its ``text_written`` may come later)."""
        self._rows.append(first)

    def columns(self, clock_start: float) -> dict[str, np.ndarray]:
        """``request_id``, ``response_id`` (the id of its chunks, what a client sees) and
        each moment (seconds since ``clock_start``, the records' zero)."""
        rows = self._rows
        out = {
            "request_id": np.array([r.request_id for r in rows], dtype=np.int64),
            "response_id": np.array([r.response_id for r in rows], dtype=str),
        }
        for f in fields(FirstToken)[2:]:
            out[f.name] = np.array([getattr(r, f.name) for r in rows], dtype=float) - clock_start
        return out

    def save_npz(self, path: str, clock_start: float) -> None:
        np.savez_compressed(path, **self.columns(clock_start))


def load_npz(path: str) -> dict[str, np.ndarray]:
    """``TtftTrace.save_npz``'s columns."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def split(trace: dict[str, np.ndarray], rec: RunRecords) -> dict[str, np.ndarray]:
    """Per request of ``rec`` (its rows' order): each ``SPLIT`` figure (seconds; NaN for a
    request not streamed, or whose first token was never written) and ``receipt_lag``, the
    records' arrival less the trace's receipt: 0, or negative for a request received after
    the engine's loop read the clock for the plan it joined (its arrival is that plan's time,
    at most a step earlier: ``executor.serve.inbox``), so ``ttft + ttft_out + receipt_lag =
    written - receipt``.

    Raises:
        ValueError: the trace names a request the records do not have.
    """
    row = np.searchsorted(rec.request_id, trace["request_id"])
    row = np.minimum(row, max(len(rec.request_id) - 1, 0))
    if len(trace["request_id"]) and not np.array_equal(rec.request_id[row], trace["request_id"]):
        raise ValueError("request_id: the trace names requests the records do not have")
    n = rec.num_requests
    moments = {"first": first_token_time(rec)}
    for name in STAMPS:
        col = np.full(n, np.nan)
        col[row] = trace[name]
        moments[name] = col
    out = {k: moments[b] - moments[a] for k, (a, b) in SPLIT.items()}
    out["receipt_lag"] = rec.arrival_time - moments["receipt"]
    return out


def client_split(
    trace: dict[str, np.ndarray],
    response_id: np.ndarray,
    start: np.ndarray,
    first: np.ndarray,
    first_is_text: bool,
) -> dict[str, np.ndarray]:
    """The client's ends of each of its requests (its chunks' id, when it began sending and
    when it read its first token, in seconds on the records' clock): ``in_send``, from its
    start to the endpoint's (the client's sending, the kernel, the server's HTTP parsing and
    routing), and ``out_read``, from the first token's chunk written (``first_is_text``: the
    first chunk with text, as GuideLLM counts) to the client's reading it; NaN for a request
    the trace lacks; and ``request_id``, the engine's id of each (-1: not in the trace)."""
    n = len(response_id)
    if not len(trace["response_id"]):
        nan = np.full(n, np.nan)
        return {"in_send": nan, "out_read": nan.copy(), "request_id": np.full(n, -1)}
    order = np.argsort(trace["response_id"])
    ids = trace["response_id"][order]
    row = order[np.minimum(np.searchsorted(ids, response_id), len(ids) - 1)]
    found = trace["response_id"][row] == response_id

    def moment(name: str) -> np.ndarray:
        return np.where(found, trace[name][row], np.nan)

    written = moment("text_written" if first_is_text else "written")
    rid = np.where(found, trace["request_id"][row], -1)
    return {"in_send": moment("handler") - start, "out_read": first - written, "request_id": rid}
