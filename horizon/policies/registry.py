"""Policies by name. An unknown name raises ValueError listing the known ones."""

from __future__ import annotations

from typing import Any

from horizon.policies.base import Policy
from horizon.policies.fcfs import FCFS
from horizon.policies.horizon import HorizonPolicy
from horizon.policies.lpf import LongestPromptFirst
from horizon.policies.memory_first import MemoryFirst
from horizon.policies.oracle_srpt import OracleSRPT
from horizon.policies.random_order import RandomOrder
from horizon.policies.sglang import SGLangPolicy
from horizon.policies.sjf_predicted import SJFPredicted
from horizon.policies.sjf_prompt import SJFPrompt
from horizon.policies.vllm import VLLM
from horizon.registry import Registry

BUILTIN = (
    FCFS,
    MemoryFirst,
    SJFPrompt,
    SJFPredicted,
    RandomOrder,
    LongestPromptFirst,
    VLLM,
    SGLangPolicy,
    OracleSRPT,
    HorizonPolicy,
)


def _builtin() -> Registry[Policy]:
    reg: Registry[Policy] = Registry("policy")
    for cls in BUILTIN:
        reg.register(cls.name, cls)
    return reg


POLICIES = _builtin()  # read-only after import: a table of constructors, no run state


def policy_names() -> list[str]:
    return POLICIES.names()


def make_policy(name: str, **kwargs: Any) -> Policy:
    """Build the policy registered as ``name`` with its keyword options."""
    return POLICIES.make(name, **kwargs)
