"""First come, first served: arrival order, admit while blocks last, preempt the newest."""

from __future__ import annotations

from horizon.policies.base import Policy


class FCFS(Policy):
    name = "fcfs"
