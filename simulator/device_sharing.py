"""How co-located replicas share one GPU: the device's sharing rule and its fitted time slices.

Three rules, chosen by ``DeviceSpec.sharing`` (``ReplicaSetup.device`` takes a spec or a name):

* ``fcfs``: steps serialized first come, first served at step granularity (no parameter;
  ``simulator.shared_device``).
* ``timeslice``: steps overlap and the device alternates between the busy contexts. A step
  that takes ``d`` alone (its replica's isolated cost model) comes in ``n`` slices (decode-only
  steps: 1; steps with prefill chunks: ``max(1, ceil(w . x))``, ``x`` its ``SLICE_TERMS``), and
  before each of its slices every other replica with a step in flight runs one slice of its
  own: the step ends at ``t + d + n * sum_j d_j / n_j`` over those other steps ``j``.
* ``quantum``: the device's turns simulated as they run, round robin with a time slice
  (``simulator.quantum_device``); a step's end is known when it is over.

Why this rule (measured on the engine's co-located runs: 2 and 4 Qwen2.5-0.5B processes on one
H200, no MPS, 432,000 steps with a neighbour busy; ``results/cluster_fidelity/
device_sharing_fit.json``): the driver time-slices the contexts that have work, and a step's
time is its own plus whole slices of its neighbours'. A decode step (one CUDA graph, ~1 ms)
took ``2.03x`` its isolated time beside one busy neighbour and ``4.07x`` beside three (each
neighbour's decode step runs once in between). Steps with prefill chunks come in whole rounds,
not stretched by a factor: at 4 replicas those under 256 tokens took 6.1 ms (median; 78% one
round of the three neighbours' steps), those of 256-1,535 tokens 10.7 ms (68% two rounds) and
longer ones 15.4 ms (40% three), as if the GPU preempted a long graph at a time slice. With the
slice count fitted to those rounds (``w``, from the plan) and each neighbour's slice its step's
isolated time per slice, the fitted factor on the neighbours' slices came out 1.01 (decode) and
0.99 (mixed), so the rule has no switch cost. Processor sharing (``d * (1 + a * k)``, ``a``
fitted per step kind: 1.03 decode, 0.74 mixed) gets the mean step time but puts every mixed
step in one mode; FCFS at step granularity spreads the decode steps (4 replicas, sessions) from
3.1 ms (median) to 9.5 ms (q99) where the engine's lie between 4.4 and 5.8: a step slips in
between its neighbours' or waits for their whole steps.

Slice counts come from one of two fits (``DeviceSpec.fit``): ``SliceFit``, deterministic per
plan (variant (c) of docs/cluster.md), or ``SliceCounts``, drawn per step from the measured
shares of 1..``MAX_SLICES`` slices at the step's own time (its replica's cost model's price;
variant (d), with ``simulator.colocated_cost_model``, whose own-part prices those shares were
measured against): the engine's steps of one shape split between one and two slices, which a
deterministic count cannot. The draws are seeded (``SliceCounts.seed``), one per mixed step in
booking order.

The rule is causal, because the simulator needs a step's end when it is submitted: a step
counts the neighbours' steps in flight at its submission (the pipelined engine plans a step
while the one before runs, and the fit counts them at the same moment), and a step booked later
does not stretch one booked before. Deterministic: the same bookings in the same order give the
same ends; with no neighbour in flight a step takes exactly its isolated time.
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from horizon.plan import StepPlan

SHARING_RULES = ("fcfs", "timeslice", "quantum")
FIT_FILE = (
    Path(__file__).resolve().parents[1] / "results" / "cluster_fidelity" / "device_sharing_fit.json"
)
# a mixed step's terms for its slice count (``SliceFit.weights``), from its plan
SLICE_TERMS = (
    "fixed",
    "tokens",
    "attention_kpairs",
    "prefill_context",
    "decode_context",
    "decodes",
)


# ``SliceCounts``: a step with prefill chunks takes 1..MAX_SLICES slices, drawn by the bin of
# its own time among these edges (seconds)
MAX_SLICES = 4
SLICE_EDGES_S = tuple(round(1e-3 * (1.0 + 0.25 * i), 6) for i in range(21))  # 1 .. 6 ms


def slice_terms(plan: StepPlan) -> tuple[float, ...]:
    """``SLICE_TERMS`` of a plan (attention pairs in thousands)."""
    return (
        1.0,
        float(plan.num_prefill_tokens + len(plan.decodes)),
        plan.prefill_attention_pairs / 1e3,
        float(plan.prefill_context_tokens),
        float(plan.decode_context_tokens),
        float(len(plan.decodes)),
    )


@dataclass(frozen=True, order=True)
class SliceFit:
    """The ``timeslice`` rule's fit: a mixed step's slices ``max(1, ceil(weights . x))``."""

    weights: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.weights) != len(SLICE_TERMS):
            raise ValueError(
                f"SliceFit.weights: {len(self.weights)} values for {len(SLICE_TERMS)} terms"
            )
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in self.weights):
            raise ValueError(f"SliceFit.weights must be finite numbers, got {self.weights!r}")

    def slices(self, plan: StepPlan | None) -> int:
        if plan is None or plan.num_prefill_tokens == 0:
            return 1
        u = sum(a * b for a, b in zip(self.weights, slice_terms(plan)))
        return max(1, math.ceil(u))

    @classmethod
    def from_file(cls, path: str | Path = FIT_FILE) -> SliceFit:
        """The weights a ``fit-sharing`` run wrote (``timeslice.weights``), with its source."""
        doc = json.loads(Path(path).read_text())
        ts = doc["timeslice"]
        return cls(tuple(float(v) for v in ts["weights"]), str(doc.get("source", path)))


@dataclass(frozen=True, order=True)
class SliceCounts:
    """A mixed step's slice count drawn by its own time ``d``: in bin
    ``bisect(edges_s, d)`` (``len(edges_s) + 1`` bins), 1..``len(row)`` slices with the
    probabilities ``probs[bin]``; decode-only steps take 1. ``seed`` seeds the draws."""

    edges_s: tuple[float, ...] = SLICE_EDGES_S
    probs: tuple[tuple[float, ...], ...] = ()
    seed: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        if list(self.edges_s) != sorted(self.edges_s) or not self.edges_s:
            raise ValueError(f"SliceCounts.edges_s must be increasing, got {self.edges_s!r}")
        if len(self.probs) != len(self.edges_s) + 1:
            raise ValueError(
                f"SliceCounts.probs: {len(self.probs)} rows for {len(self.edges_s) + 1} bins"
            )
        for row in self.probs:
            if not row or min(row) < 0 or abs(sum(row) - 1) > 1e-3:
                raise ValueError(f"SliceCounts.probs rows must be distributions, got {row!r}")

    def draw(self, plan: StepPlan | None, duration: float, rng: random.Random) -> int:
        if plan is None or plan.num_prefill_tokens == 0:
            return 1
        row = self.probs[bisect.bisect(self.edges_s, duration)]
        u, acc = rng.random(), 0.0
        for n, p in enumerate(row, start=1):
            acc += p
            if u < acc:
                return n
        return len(row)


@dataclass(frozen=True, order=True)
class DeviceSpec:
    """A shared GPU: its name (replicas naming the same spec share it) and its sharing rule;
    ``timeslice`` takes ``fit``: a ``SliceFit`` or ``SliceCounts`` (None:
    ``SliceFit.from_file()``, read when the device is made); ``quantum``
    (``simulator.quantum_device``) takes its time slice ``quantum_s`` and the cost of a
    switch between contexts ``switch_s`` (seconds)."""

    name: str
    sharing: str = "fcfs"
    fit: SliceFit | SliceCounts | None = None
    quantum_s: float | None = None
    switch_s: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name):
            raise ValueError(f"DeviceSpec.name must be a non-empty str, got {self.name!r}")
        if self.sharing not in SHARING_RULES:
            raise ValueError(f"DeviceSpec.sharing {self.sharing!r}: known {SHARING_RULES}")
        if self.fit is not None and not isinstance(self.fit, (SliceFit, SliceCounts)):
            raise ValueError(f"DeviceSpec.fit must be a SliceFit or SliceCounts, got {self.fit!r}")
        if self.fit is not None and self.sharing != "timeslice":
            raise ValueError(f"DeviceSpec.fit is for sharing='timeslice', not {self.sharing!r}")
        quantum = self.sharing == "quantum"
        if quantum != (self.quantum_s is not None):
            raise ValueError("DeviceSpec.quantum_s goes with sharing='quantum', and only there")
        if quantum and not (isinstance(self.quantum_s, (int, float)) and self.quantum_s > 0):
            raise ValueError(f"DeviceSpec.quantum_s must be > 0 seconds, got {self.quantum_s!r}")
        if not (isinstance(self.switch_s, (int, float)) and 0 <= self.switch_s < math.inf):
            raise ValueError(f"DeviceSpec.switch_s must be >= 0 seconds, got {self.switch_s!r}")
        if self.switch_s and not quantum:
            raise ValueError(f"DeviceSpec.switch_s is for sharing='quantum', not {self.sharing!r}")


class TimeSlices:
    """The ``timeslice`` rule's bookings: the steps whose end is still ahead, by end time.
    With ``SliceCounts`` each mixed step's count is drawn (seeded) as it is booked.

    Contracts:
        * ``book(t, d, plan, now, owner)`` returns ``t + d + n * sum_j d_j / n_j >= t + d``
          over the other owners' (replicas') steps in flight at ``now`` (booked with
          ``start <= now < end``; ``owner``: any hashable naming the replica, whose own steps
          never count); with none in flight, ``t + d``.
        * ``now`` (the clock at submission) never decreases between calls and no step starts
          before it; bookings ending by ``now`` are dropped, so memory is O(steps in flight).
    """

    def __init__(self, fit: SliceFit | SliceCounts) -> None:
        self.fit = fit
        self._rng = random.Random(fit.seed) if isinstance(fit, SliceCounts) else None
        # heap of (end, start, owner, isolated time per slice)
        self._ends: list[tuple[float, float, int, float]] = []
        self._now = -math.inf
        self._index: dict[object, int] = {}  # owner -> its index, in order of first booking

    def book(
        self, t: float, duration: float, plan: StepPlan | None, now: float, owner: object
    ) -> float:
        assert now >= self._now and t >= now, "bookings out of time order"
        self._now = now
        me = self._index.setdefault(owner, len(self._index))
        ends = self._ends
        while ends and ends[0][0] <= now:
            heapq.heappop(ends)
        others = sorted((o, per) for _, start, o, per in ends if start <= now and o != me)
        rng = self._rng
        n = self.fit.slices(plan) if rng is None else self.fit.draw(plan, duration, rng)
        end = t + duration + n * sum(per for _, per in others)
        heapq.heappush(ends, (end, t, me, duration / n))
        return end

    @property
    def in_flight(self) -> int:
        return len(self._ends)

    def check_integrity(self) -> None:
        assert all(s <= e and math.isfinite(e) for e, s, _, _ in self._ends), "ends first"
        assert all(e >= self._now for e, _, _, _ in self._ends), "a finished booking kept"
