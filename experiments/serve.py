"""The OpenAI-compatible server with a policy from the project's config groups.

    python -m experiments.serve policy=horizon -- --model qwen2.5-7b --tokenizer qwen
    python -m experiments.serve policy=horizon_oracle model=qwen2.5-0.5b slo=h200_0.5b -- \
        --model qwen2.5-0.5b

Before ``--``: Hydra overrides of ``configs/run.yaml``, as ``experiments.run`` takes them; the
policy is built as every simulator run builds it (``experiments.policy_factory``: its options,
its TTFT target from the ``slo`` preset, its length predictor trained on the ``workload``'s
training split, or loaded from the predictor's artifact). After ``--``: the options of
``python -m executor.serve``, whose ``--policy`` this replaces. The ``oracle`` predictor reads a
request's ``max_tokens``: exact for forced-length serving (``min_tokens == max_tokens``), not
for real text.
"""

from __future__ import annotations

import sys

from hydra.errors import HydraException

from experiments.config_store import run_config
from experiments.policy_factory import BuiltPolicy, build_policy
from experiments.workloads import DataSources


def serving_policy(overrides: list[str]) -> BuiltPolicy:
    """The policy (fresh, with its predictor) that ``overrides`` configure, for one server."""
    cfg = run_config(overrides)
    sources = DataSources(cfg.data)
    return build_policy(
        cfg.policy, cfg.slo.ttft, predictor_for=lambda p: sources.predictor(p, cfg.workload)
    )


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra overrides, the server's options): the two sides of ``--``."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def main(argv: list[str] | None = None) -> int:
    from executor.serve.__main__ import main as serve_main

    overrides, server_args = split_argv(sys.argv[1:] if argv is None else argv)
    if "--policy" in server_args:
        print("error: --policy: the policy comes from the overrides before --", file=sys.stderr)
        return 2
    try:
        built = serving_policy(overrides)
    except (HydraException, ValueError) as e:  # an unknown group option, a bad value
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return serve_main(server_args, policy=built.policy)


if __name__ == "__main__":
    sys.exit(main())
