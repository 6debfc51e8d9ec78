"""What the headline compares (``experiments.policy_gain``) and how its baselines are tuned
(``experiments.policy_tuning``): the settings, the rows and each knob's candidate values.

Every setting is the documented one (the Qwen2.5-7B shape on one H200 with the engine-fitted
cost model, 3,000 KV blocks, SLO ``h200_7b``: TTFT 1 s, every ITL 50 ms, lifetime goodput) on
requests from the half of ShareGPT held out of the learned predictor's training; they differ in
what arrives and how:

* ``poisson``: first turns, Poisson arrivals;
* ``azure``: first turns at the Azure 2023 conv trace's timestamps, scaled to the same mean rate;
* ``multi_turn``: every turn with its chat history as prompt (later turns share a cached
  prefix), 16 conversations interleaved, Poisson arrivals; prefix caching on.
"""

from __future__ import annotations

COMMON = [
    "workload.conversations=held_out",
    "workload.split_test_fraction=0.5",
    "model.num_blocks=3000",
    "slo=h200_7b",
]
SETTINGS: dict[str, list[str]] = {
    "poisson": ["workload=sharegpt_first_turn", *COMMON],
    "azure": ["workload=sharegpt_azure_arrivals", *COMMON],
    "multi_turn": ["workload=sharegpt_multi_turn", *COMMON],
}

# row -> its overrides. ``tuned/<name>`` configs are written by experiments.policy_tuning.
ROWS: dict[str, list[str]] = {
    "fcfs": ["policy=fcfs"],
    "vllm": ["policy=vllm"],
    "random": ["policy=random"],
    "lpf": ["policy=lpf"],
    "sjf_prompt": ["policy=tuned/sjf_prompt"],
    "sjf_predicted": ["policy=tuned/sjf_predicted"],
    "memory_first": ["policy=tuned/memory_first"],
    "sglang": ["policy=tuned/sglang"],
    "horizon_mean": ["policy=tuned/horizon_mean"],
    "horizon_learned": ["policy=tuned/horizon"],
    "horizon_oracle": ["policy=horizon_oracle"],
    "oracle_srpt": ["policy=oracle_srpt"],
}
# The previous headline's rows with the configs as shipped (no tuning): what the shedding
# reference (experiments.shedding_reference) and the committed engine headline
# (experiments.headline_engine) were run with.
SHIPPED_ROWS: dict[str, list[str]] = {
    "fcfs": ["policy=fcfs"],
    "memory_first": ["policy=memory_first"],
    "sjf_prompt": ["policy=sjf_prompt"],
    "horizon_learned": ["policy=horizon"],
    "horizon_mean": ["policy=horizon_mean"],
    "horizon_oracle": ["policy=horizon_oracle"],
    "oracle_srpt": ["policy=oracle_srpt"],
}
# rows only some settings have: SGLang's longest-prefix-match order where prefixes repeat
EXTRA_ROWS: dict[str, dict[str, list[str]]] = {
    "multi_turn": {"sglang_lpm": ["policy=tuned/sglang", "policy.options.lpm=true"]},
}
ORACLES = ("horizon_oracle", "oracle_srpt")  # read the true output length: never "strongest"
HORIZON, HORIZON_MEAN = "horizon_learned", "horizon_mean"


def rows_of(setting: str) -> dict[str, list[str]]:
    """The rows a setting compares (``ROWS`` and its ``EXTRA_ROWS``)."""
    return {**ROWS, **EXTRA_ROWS.get(setting, {})}


# The tuning budget: every policy with a knob gets the same number of candidate settings
# (nine), chosen on the tuning seed by rate_at_90 in the poisson setting. Each candidate is a
# list of option overrides of the policy config named first; the first is the shipped default.
# Two rounds: six spread over the knob's range, then three more around each policy's best of
# those (beyond it where the best was at the range's edge).
TUNING_SEED = 100
# round one
HEADROOM = (0.05, 0.0, 0.025, 0.1, 0.15, 0.2)  # Horizon's share of the pool kept free
SGLANG = ((4096, 1.0), (512, 1.0), (256, 1.0), (128, 1.0), (256, 0.3), (128, 0.3))  # clip, scale
AGING = (100.0, 0.0, 10.0, 30.0, 300.0, 1000.0)  # sjf's predicted tokens per second waited
QUANTILE = (0.99, 0.2, 0.35, 0.5, 0.7, 0.9)  # memory_first's reserved output quantile
_AGING = "policy.options.aging_tokens_per_s="
TUNING: dict[str, tuple[str, list[list[str]]]] = {
    "horizon": (
        "horizon",
        [[f"policy.options.headroom={h}"] for h in (*HEADROOM, 0.04, 0.06, 0.075)],
    ),
    "horizon_mean": (
        "horizon_mean",
        [[f"policy.options.headroom={h}"] for h in (*HEADROOM, 0.075, 0.09, 0.125)],
    ),
    "sglang": (  # SGLang's two admission knobs: the reserve's clip and the ratio's scale
        "sglang",
        [
            [f"policy.options.clip_max_new_tokens={c}", f"policy.options.conservativeness={k}"]
            for c, k in (*SGLANG, (96, 1.0), (64, 1.0), (32, 1.0))
        ],
    ),
    "sjf_prompt": ("sjf_prompt", [[_AGING + str(a)] for a in (*AGING, 1.0, 3.0, 5.0)]),
    "sjf_predicted": ("sjf_predicted", [[_AGING + str(a)] for a in (*AGING, 1.0, 3.0, 5.0)]),
    "memory_first": (
        "memory_first_q99",
        [[f"policy.options.quantile={q}"] for q in (*QUANTILE, 0.1, 0.15, 0.25)],
    ),
}
