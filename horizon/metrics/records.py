"""What a run leaves behind: per-request and per-step records, as numpy columns.

Both backends produce the same ``RunRecords`` (the simulator from its modelled clock, the engine
from the wall clock), so every metric and plot applies to either unchanged.

Per request (arrays of length N, ordered by request_id):

    request_id, arrival_time, num_prompt_tokens, true_output_tokens, max_output_tokens,
    num_output_tokens      tokens actually emitted (== true_output_tokens iff finished)
    status                 STATUS_FINISHED / STATUS_REJECTED / STATUS_UNFINISHED, or
                           STATUS_HANDED_OFF on a prefill replica (decoded on another)
    reject_reason          list[str], "" unless rejected
    ttft_slo, itl_slo      the request's SLO in seconds (NaN: none given)
    first_admit_time       first admission (NaN if never admitted): queue wait = this - arrival
    num_preemptions        preemptions by recompute
    computed_tokens        all tokens it computed (prefill chunks + decodes, recompute included)
    recomputed_tokens      of those, tokens computed again after a preemption
    cached_tokens          prompt tokens served by the prefix cache (summed over admissions)

Token times are a CSR pair: the times of request i's output tokens are
``token_times[token_offsets[i]:token_offsets[i + 1]]`` (seconds, non-decreasing).

Per step (arrays of length S): step_start (when the step was planned), step_end (when its
tokens were out; non-decreasing), prefill_tokens, decode_tokens,
num_running, num_waiting (after the step's admissions), kv_used_blocks, token_budget, and the
rest of the step's plan shape (``horizon.plan.PLAN_SHAPE_FIELDS``): num_prefills (chunks),
decode_context_tokens, prefill_context_tokens, prefill_attention_pairs, and num_refreshed (the
policy's host work, ``StepPlan.num_refreshed``) and num_preempted (requests the plan preempted:
a pipelined engine drains its pipeline for such a plan) — what a cost model reads, so that a
run's measured steps can calibrate one. Records written before these columns existed
load with them at -1 (unknown).
Scalars: num_kv_blocks, block_size.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from horizon.metrics.column_codec import decode_columns, encode_columns

STATUS_FINISHED = 0
STATUS_REJECTED = 1
STATUS_UNFINISHED = 2
STATUS_HANDED_OFF = 3  # prefilled here and handed to a decode replica (disaggregated serving)

# Per-step plan columns beyond prefill_tokens / decode_tokens (added in records v3).
STEP_PLAN_COLUMNS = (
    "num_prefills",
    "decode_context_tokens",
    "prefill_context_tokens",
    "prefill_attention_pairs",
    "num_refreshed",
    "num_preempted",  # records v4
)

# The .npz layout save_npz writes (a scalar "format" in the file; files without one are format 1,
# every column as it is). Format 2: column_codec encodings, their plan as JSON in "codecs".
NPZ_FORMAT = 2
# Float columns whose every value is one of another's: a token is out when its step ends, and a
# request is first admitted when a step is planned.
NPZ_REFERENCES = {"token_times": "step_end", "first_admit_time": "step_start"}


@dataclass(frozen=True, eq=False)
class RunRecords:
    request_id: np.ndarray
    arrival_time: np.ndarray
    num_prompt_tokens: np.ndarray
    true_output_tokens: np.ndarray
    max_output_tokens: np.ndarray
    num_output_tokens: np.ndarray
    status: np.ndarray
    reject_reason: list[str]
    ttft_slo: np.ndarray
    itl_slo: np.ndarray
    first_admit_time: np.ndarray
    num_preemptions: np.ndarray
    computed_tokens: np.ndarray
    recomputed_tokens: np.ndarray
    cached_tokens: np.ndarray
    token_times: np.ndarray
    token_offsets: np.ndarray
    step_start: np.ndarray
    step_end: np.ndarray
    prefill_tokens: np.ndarray
    decode_tokens: np.ndarray
    num_running: np.ndarray
    num_waiting: np.ndarray
    kv_used_blocks: np.ndarray
    token_budget: np.ndarray
    num_prefills: np.ndarray
    decode_context_tokens: np.ndarray
    prefill_context_tokens: np.ndarray
    prefill_attention_pairs: np.ndarray
    num_refreshed: np.ndarray
    num_preempted: np.ndarray
    num_kv_blocks: int
    block_size: int

    @property
    def num_requests(self) -> int:
        return len(self.request_id)

    def tokens_of(self, i: int) -> np.ndarray:
        """Output-token times of the request at row ``i``."""
        return self.token_times[self.token_offsets[i] : self.token_offsets[i + 1]]

    def digest(self) -> str:
        """SHA-256 over every column's bytes: equal digests mean byte-identical records."""
        h = hashlib.sha256()
        for f in fields(self):
            v = getattr(self, f.name)
            h.update(f.name.encode())
            if isinstance(v, np.ndarray):
                h.update(str(v.dtype).encode())
                h.update(np.ascontiguousarray(v).tobytes())
            else:
                h.update(repr(v).encode())
        return h.hexdigest()

    def save_npz(self, path: str) -> None:
        """Every field into one compressed ``.npz`` (numpy only: what a GPU machine without
        pyarrow writes; ``experiments.records_io`` turns it into the Parquet run layout).

        Written in ``NPZ_FORMAT``: each column in the most compact of ``column_codec``'s
        lossless encodings (a token's time as the index of the step whose end it is), so that
        ``load_npz`` gives back records of the same ``digest``."""
        arrays = {f.name: getattr(self, f.name) for f in fields(self)}
        arrays["reject_reason"] = np.array(self.reject_reason, dtype=str)
        arrays["num_kv_blocks"] = np.array(self.num_kv_blocks)
        arrays["block_size"] = np.array(self.block_size)
        stored, plan = encode_columns(arrays, NPZ_REFERENCES)
        members: dict[str, Any] = {
            "format": np.array(NPZ_FORMAT),
            "codecs": np.array(json.dumps(plan, sort_keys=True)),
            **stored,
        }
        np.savez_compressed(path, **members)

    @classmethod
    def load_npz(cls, path: str) -> RunRecords:
        """Records from a ``save_npz`` file of any format so far (1: every column as it is).

        Raises:
            ValueError: the file's format is newer than this code.
        """
        with np.load(path, allow_pickle=False) as z:
            version = int(z["format"]) if "format" in z else 1
            if version == 1:
                kw = {f.name: z[f.name] for f in fields(cls) if f.name in z}
            elif version == NPZ_FORMAT:
                kw = decode_columns({k: z[k] for k in z.files}, json.loads(str(z["codecs"])))
            else:
                raise ValueError(
                    f"{path}: records format {version} unknown (this code reads 1 to {NPZ_FORMAT})"
                )
        steps = len(kw["step_end"])
        for name in STEP_PLAN_COLUMNS:  # files from before these columns: unknown
            kw.setdefault(name, np.full(steps, -1, dtype=np.int64))
        kw["reject_reason"] = [str(s) for s in kw["reject_reason"]]
        kw["num_kv_blocks"] = int(kw["num_kv_blocks"])
        kw["block_size"] = int(kw["block_size"])
        return cls(**kw)

    def step_durations(self) -> np.ndarray:
        """Each step's own time: from the later of its start (when it was planned) and the
        previous step's end, to its end. Equal to ``step_end - step_start`` unless a step was
        planned while the one before it ran (a pipelined engine), where that difference would
        count the overlap twice."""
        prev_end = np.concatenate(([-np.inf], self.step_end[:-1]))
        return self.step_end - np.maximum(self.step_start, prev_end)

    def longest_decode_contexts(self) -> np.ndarray:
        """Per step, the longest context one of its decodes read (``Request.num_computed_tokens``
        before the step; 0 for steps without decodes): the decode whose attention walks the
        most keys, which a step with prefill chunks waits for (``simulator.engine_cost_model``).
        Derived from the token times, so records of any version have it: a token is a decode's
        when its request's previous token came out in the step before (a running request emits
        every step; one that ends a recompute after a preemption was out of at least one)."""
        out = np.zeros(len(self.step_end), dtype=np.int64)
        counts = np.diff(self.token_offsets)
        index = np.arange(len(self.token_times)) - np.repeat(self.token_offsets[:-1], counts)
        steps = np.searchsorted(self.step_end, self.token_times, side="left")
        later = np.flatnonzero(index >= 1)
        decode = later[steps[later] == steps[later - 1] + 1]
        if len(decode):
            context = np.repeat(self.num_prompt_tokens, counts)[decode] + index[decode] - 1
            np.maximum.at(out, steps[decode], context)
        return out

    def check(self) -> None:
        """Assert the records' own invariants (used by tests and after every run)."""
        n = self.num_requests
        assert len(self.token_offsets) == n + 1 and self.token_offsets[0] == 0
        assert self.token_offsets[-1] == len(self.token_times)
        assert np.array_equal(np.diff(self.token_offsets), self.num_output_tokens)
        fin = self.status == STATUS_FINISHED
        assert np.array_equal(self.num_output_tokens[fin], self.true_output_tokens[fin])
        assert np.all(self.num_output_tokens[self.status == STATUS_REJECTED] == 0)
        assert np.all(np.diff(self.step_end) >= 0)
