"""Built-in scheduling policies and their registry."""

from horizon.policies.base import Policy
from horizon.policies.registry import make_policy, policy_names

__all__ = ["Policy", "make_policy", "policy_names"]
