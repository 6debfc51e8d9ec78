"""What a cluster run leaves behind: each replica's ``RunRecords`` and the routing.

``merged`` is one ``RunRecords`` over every request of the run (request columns from the
replica that served it, ordered by request id; step columns are every replica's steps ordered
by end time, with the pool the sum of the replicas'), so every single-replica metric (goodput,
TTFT, ITL) applies to the cluster unchanged. Per-replica metrics read ``replicas[i]``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields

import numpy as np

from horizon.metrics.records import STEP_PLAN_COLUMNS, RunRecords

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
    e.g. a session's turn after a rejected one), and routing figures."""

    replicas: tuple[RunRecords, ...]
    assignment: np.ndarray
    route_wall_s: float
    names: tuple[str, ...]

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
        return h.hexdigest()

    def check(self) -> None:
        """Each replica's invariants; every request sits on the replica it was routed to."""
        for i, r in enumerate(self.replicas):
            r.check()
            assert np.all(self.assignment[r.request_id] == i), f"replica {i} holds others' requests"
        held = sum(r.num_requests for r in self.replicas)
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
    return RunRecords(**kw)


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
