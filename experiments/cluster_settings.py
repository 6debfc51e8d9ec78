"""The cluster studies' settings: workloads, loads, routers and the replicas they run on.

Every setting runs 4 replicas of the Qwen2.5-7B shape on H200s, each with the KV-bound pool of
the single-replica headline (3,000 blocks of 16 tokens), fcfs, and the cost model fitted to
the engine's online steps, on the engine's loop; SLO TTFT 1 s, every ITL 50 ms (the h200_7b
preset). Loads are per-replica request rates (Poisson), or session starts per second for the
closed-loop multi-turn setting. Seeds 0-2. The horizon router reads the prompt-length
predictor (``prompt_length``, fitted on the training split's first turns): a real predictor,
not an oracle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REPLICAS = 4
NUM_BLOCKS = 3000
SEEDS = (0, 1, 2)
SLO_TTFT, SLO_ITL = 1.0, 0.05
REQUESTS = 4000
SESSIONS = 3000
THINK_TIME_S = 5.0

# name -> (registry router, options): the routing study's rows
ROUTING_ROWS = {
    "round_robin": ("round_robin", {}),
    "random": ("random", {}),
    "least_loaded": ("least_loaded", {}),
    "least_kv": ("least_kv", {}),
    "prefix_aware": ("prefix_aware", {"threshold": None}),  # pure cache affinity
    "hybrid_t2": ("prefix_aware", {"threshold": 2}),
    "hybrid_t8": ("prefix_aware", {"threshold": 8}),
    "hybrid_t32": ("prefix_aware", {"threshold": 32}),
    "weighted": ("weighted", {}),
    "cost_aware": ("cost_aware", {}),
    "horizon": ("horizon", {}),
}
# the multi-turn study's rows
SESSION_ROWS = {
    "round_robin": ("round_robin", {}),
    "least_loaded": ("least_loaded", {}),
    "sticky": ("sticky", {}),
    "hybrid_t8": ("prefix_aware", {"threshold": 8}),
    "cost_aware": ("cost_aware", {}),
    "horizon": ("horizon", {}),
}


@dataclass(frozen=True)
class Setting:
    """One study's workload: ``kind`` is ``first_turn``, ``shared_prefix`` or ``sessions``;
    ``loads`` per-replica request rates (sessions: session starts per second)."""

    name: str
    study: str
    kind: str
    loads: tuple[float, ...]
    rows: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)


SETTINGS = {
    s.name: s
    for s in (
        Setting("first_turn", "routing", "first_turn", (45, 50, 55, 60, 65, 70), ROUTING_ROWS),
        Setting(
            "shared_prefix",
            "routing",
            "shared_prefix",
            (15, 20, 25, 30, 35, 40, 50, 60),
            ROUTING_ROWS,
            {"num_groups": 32, "prefix_tokens": 1024},
        ),
        Setting("sessions", "multi_turn", "sessions", (12, 16, 20, 24, 28, 32), SESSION_ROWS),
    )
}
