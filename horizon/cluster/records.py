"""What a cluster run leaves behind: each replica's ``RunRecords`` and the routing.

``merged`` is one ``RunRecords`` over every request of the run (request columns from the
replica that served it, ordered by request id; step columns are every replica's steps ordered
by end time, with the pool the sum of the replicas'), so every single-replica metric (goodput,
TTFT, ITL) applies to the cluster unchanged. Per-replica metrics read ``replicas[i]``.

Disaggregated runs: a handed-off request has a row on its prefill replica (status
``STATUS_HANDED_OFF``, no tokens) and one on its decode replica. ``merged`` folds the two into
the decode row, with the earlier first admission and the tokens computed on both summed; a
request handed off whose KV never arrived counts as unfinished. ``transfers`` holds every KV
transfer (``horizon.cluster.handoffs.TRANSFER_COLUMNS``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields

import numpy as np

from horizon.metrics.records import (
    STATUS_HANDED_OFF,
    STATUS_UNFINISHED,
    STEP_PLAN_COLUMNS,
    RunRecords,
)

_STEP = (
    "step_start",
    "step_end",
    "prefill_tokens",
    "decode_tokens",
    "num_running",
    "num_waiting",
    "kv_used_blocks",
    "token_budget",
    *STEP_PLAN_COLUMNS,
)
_TOKENS = ("token_times", "token_offsets")


@dataclass(frozen=True, eq=False)
class ClusterRecords:
    """Per-replica records, the replica of each request id (``assignment``, -1: never arrived,
    e.g. a session's turn after a rejected one; disaggregated: its prefill replica), routing
    figures, the KV transfers of a disaggregated run and the fleet of an autoscaled one (None
    otherwise)."""

    replicas: tuple[RunRecords, ...]
    assignment: np.ndarray
    route_wall_s: float
    names: tuple[str, ...]
    transfers: dict[str, np.ndarray] | None = None
    fleet: dict | None = None  # autoscaled runs: GPU-seconds, the fleet's timeline, decisions

    @property
    def num_replicas(self) -> int:
        return len(self.replicas)

    def merged(self) -> RunRecords:
        return merge_records(self.replicas)

    def digest(self) -> str:
        """SHA-256 over every replica's digest and the assignment (routing wall time excluded)."""
        h = hashlib.sha256()
        for r in self.replicas:
            h.update(r.digest().encode())
        h.update(np.ascontiguousarray(self.assignment, dtype=np.int64).tobytes())
        for name, col in sorted((self.transfers or {}).items()):
            h.update(name.encode())
            h.update(np.ascontiguousarray(col).tobytes())
        return h.hexdigest()

    def check(self) -> None:
        """Each replica's invariants; every request sits on the replica it was routed to."""
        t = self.transfers or {"request_id": np.zeros(0, np.int64), "dst": np.zeros(0, np.int64)}
        decoded_on = dict(zip(t["request_id"].tolist(), t["dst"].tolist()))
        for i, r in enumerate(self.replicas):
            r.check()
            mine = self.assignment[r.request_id] == i
            ids = r.request_id.tolist()
            imported = np.array([decoded_on.get(q, -1) == i for q in ids], dtype=bool)
            assert np.all(mine | imported), f"replica {i} holds others' requests"
        held = sum(r.num_requests for r in self.replicas) - len(decoded_on)
        assert held == int(np.count_nonzero(self.assignment >= 0)), "a request on two replicas"


def merge_records(parts: tuple[RunRecords, ...] | list[RunRecords]) -> RunRecords:
    """One ``RunRecords`` over all of ``parts``' requests (see the module docstring)."""
    ids = np.concatenate([p.request_id for p in parts])
    order = np.argsort(ids, kind="stable")
    kw: dict = {}
    for f in fields(RunRecords):
        name = f.name
        if name in _STEP or name in _TOKENS or name in ("num_kv_blocks", "block_size"):
            continue
        if name == "reject_reason":
            flat = [s for p in parts for s in p.reject_reason]
            kw[name] = [flat[i] for i in order.tolist()]
        else:
            kw[name] = np.concatenate([getattr(p, name) for p in parts])[order]
    kw.update(_merged_tokens(parts, order))
    ends = np.concatenate([p.step_end for p in parts])
    step_order = np.argsort(ends, kind="stable")
    for name in _STEP:
        kw[name] = np.concatenate([getattr(p, name) for p in parts])[step_order]
    kw["num_kv_blocks"] = sum(p.num_kv_blocks for p in parts)
    kw["block_size"] = parts[0].block_size
    if np.any(kw["status"] == STATUS_HANDED_OFF):
        _fold_handoffs(kw)
    return RunRecords(**kw)


_SUMMED = ("computed_tokens", "recomputed_tokens", "cached_tokens")


def _fold_handoffs(kw: dict) -> None:
    """In place: a request's handed-off row (prefill replica) folds into its other row (decode
    replica); a handed-off row with no other row becomes unfinished. Rows are in id order and
    a handed-off row holds no tokens, so the token arrays keep their order."""
    ids, status = kw["request_id"], kw["status"]
    dup = np.flatnonzero(ids[1:] == ids[:-1])  # row dup and dup + 1 are one request's
    if len(dup):
        first_is_handed = status[dup] == STATUS_HANDED_OFF
        handed = np.where(first_is_handed, dup, dup + 1)
        kept = np.where(first_is_handed, dup + 1, dup)
        assert np.all(status[handed] == STATUS_HANDED_OFF), "a request on two replicas"
        assert np.all(kw["num_output_tokens"][handed] == 0)
        a = kw["first_admit_time"]
        a[kept] = np.fmin(a[kept], a[handed])
        for name in _SUMMED:
            kw[name][kept] += kw[name][handed]
        keep = np.ones(len(ids), dtype=bool)
        keep[handed] = False
        for name, col in list(kw.items()):
            if name in _STEP or name in _TOKENS or name in ("num_kv_blocks", "block_size"):
                continue
            kw[name] = [x for x, k in zip(col, keep) if k] if isinstance(col, list) else col[keep]
        n = kw["num_output_tokens"]
        kw["token_offsets"] = np.concatenate(([0], np.cumsum(n))).astype(kw["token_offsets"].dtype)
    left = kw["status"] == STATUS_HANDED_OFF
    kw["status"] = np.where(left, STATUS_UNFINISHED, kw["status"]).astype(kw["status"].dtype)


def _merged_tokens(parts, order: np.ndarray) -> dict:  # noqa: ANN001
    spans = [
        p.token_times[p.token_offsets[i] : p.token_offsets[i + 1]]
        for p in parts
        for i in range(p.num_requests)
    ]
    spans = [spans[i] for i in order.tolist()]
    counts = np.array([len(s) for s in spans], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(parts[0].token_offsets.dtype)
    times = np.concatenate(spans) if spans else np.zeros(0)
    return {"token_times": times.astype(parts[0].token_times.dtype), "token_offsets": offsets}
