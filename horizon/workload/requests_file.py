"""A workload's requests as a small JSON file: what a GPU run replays without the data sets.

The GPU machine has no ShareGPT package or tokenizer cache: the requests are built here
(``build_workload``) and carried as this file, so the engine replays exactly the requests the
simulator ran. A path ending in ``.gz`` is written gzipped (a third of the size: what a
device call carries); either kind is read.
"""

from __future__ import annotations

import json
import lzma
import os
from collections.abc import Sequence

from horizon.request import SLO, Request
from horizon.workload.json_file import read_json, write_json

FORMAT = "horizon-requests"
VERSION = 1


def save_requests(requests: Sequence[Request], path: str | os.PathLike[str]) -> None:
    """Write fresh copies' fields (arrival, lengths, prompt ids, SLO, and the reply's ids when
    known: ``output_ids``, optional, absent from older files) of ``requests``."""
    rows = [
        {
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
        for r in requests
    ]
    doc = {"format": FORMAT, "version": VERSION, "requests": rows}
    write_json(doc, path)  # .gz / .xz compressed, byte-identical for the same input


def load_requests(path: str | os.PathLike[str]) -> list[Request]:
    """Fresh requests from a file of ``save_requests``.

    Raises:
        ValueError: not such a file, or a request field out of range (named).
    """
    try:
        doc = read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError, lzma.LZMAError) as e:
        raise ValueError(f"{path} is not a {FORMAT} v{VERSION} file ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"{path} is not a {FORMAT} v{VERSION} file")
    out = []
    for row in doc["requests"]:
        ids = row["prompt_ids"]
        slo = row["slo"]
        out_ids = row.get("output_ids")  # optional: older files do not have it
        out.append(
            Request(
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
        )
    return out
