"""Closed-loop sessions as a small JSON file: what a GPU cluster run replays without the data sets.

As ``horizon.workload.requests_file`` for open-loop requests: the sessions are built here
(``build_sessions``) and carried as this file. One object per session::

    {"session_id": 0, "start": 0.0, "think_times": [2.1, 0.4],
     "requests": [<request>, <request>, <request>]}

each request in ``requests_file``'s per-request form (``id``, ``arrival``, ``prompt_tokens``,
``max_output``, ``true_output``, ``prompt_ids``, ``conversation``, ``turn``, ``slo``,
``output_ids``). Turns after the first keep the arrival they had (a placeholder the runtime
overwrites). A path ending in ``.gz`` is written gzipped; either kind is read.
"""

from __future__ import annotations

import json
import lzma
import os
from collections.abc import Sequence

from horizon.request import SLO, Request
from horizon.workload.json_file import read_json, write_json
from horizon.workload.sessions import Session

FORMAT = "horizon-sessions"
VERSION = 1


def save_sessions(sessions: Sequence[Session], path: str | os.PathLike[str]) -> None:
    """Write every session: its id, start, think times and its turns' fields."""
    rows = [
        {
            "session_id": s.session_id,
            "start": s.start,
            "think_times": list(s.think_times),
            "requests": [request_row(r) for r in s.requests],
        }
        for s in sessions
    ]
    doc = {"format": FORMAT, "version": VERSION, "sessions": rows}
    write_json(doc, path)  # .gz / .xz compressed, byte-identical for the same input


def load_sessions(path: str | os.PathLike[str]) -> tuple[Session, ...]:
    """Fresh sessions from a file of ``save_sessions``.

    Raises:
        ValueError: not such a file, or a session or request field out of range (named).
    """
    try:
        doc = read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError, lzma.LZMAError) as e:
        raise ValueError(f"{path} is not a {FORMAT} v{VERSION} file ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"{path} is not a {FORMAT} v{VERSION} file")
    out = []
    for row in doc["sessions"]:
        out.append(
            Session(
                session_id=row["session_id"],
                requests=tuple(request_from_row(r) for r in row["requests"]),
                think_times=tuple(row["think_times"]),
                start=row["start"],
            )
        )
    return tuple(out)


def request_row(r: Request) -> dict:
    """A request's fields in ``requests_file``'s per-request form (a fresh copy's)."""
    return {
        "id": r.request_id,
        "arrival": r.arrival_time,
        "prompt_tokens": r.num_prompt_tokens,
        "max_output": r.max_output_tokens,
        "true_output": r.true_output_tokens,
        "prompt_ids": list(r.prompt_token_ids) if r.prompt_token_ids is not None else None,
        "conversation": r.conversation_id,
        "turn": r.turn_index,
        "slo": [r.slo.ttft, r.slo.itl] if r.slo is not None else None,
        "output_ids": list(r.output_token_ids) if r.output_token_ids is not None else None,
    }


def request_from_row(row: dict) -> Request:
    """A fresh request from ``request_row``'s dict (``output_ids`` optional)."""
    ids, slo, out_ids = row["prompt_ids"], row["slo"], row.get("output_ids")
    return Request(
        row["id"],
        row["arrival"],
        row["prompt_tokens"],
        row["max_output"],
        row["true_output"],
        slo=SLO(*slo) if slo is not None else None,
        prompt_token_ids=tuple(ids) if ids is not None else None,
        conversation_id=row["conversation"],
        turn_index=row["turn"],
        output_token_ids=tuple(out_ids) if out_ids is not None else None,
    )
