"""One GPU shared by co-located replicas: their steps are serialized on it.

Processes that share a GPU without MPS are time-sliced: the device runs one context's kernels
at a time, so a co-located replica's step waits while another replica's step holds the device.
The model is first come, first served at step granularity: a step submitted at ``t`` that takes
``d`` seconds alone (its replica's cost model, fitted to the replica alone on the GPU) starts at
``max(t, free_at)`` and holds the device until it ends. A replica's step time then is its wait
plus its own time, as the engine measures it on the wall clock. Host work before a plan (a cost
model's ``wake_delay``) is not booked. Submissions come in time order (a step starts no earlier
than the device's last booked end or the present), so first come is first served.
"""

from __future__ import annotations

import math


class SharedDevice:
    """The time the device is next free; ``reserve`` books a step on it.

    Contracts:
        * ``reserve(t, d)`` returns the step's end ``max(t, free_at) + d``; ``d <= 0`` books
          nothing and returns ``t``.
        * ``free_at`` never decreases; booked time never exceeds it.
    """

    def __init__(self, name: str = "gpu0") -> None:
        self.name = name
        self.free_at = 0.0
        self.busy_s = 0.0  # step time booked
        self.waited_s = 0.0  # steps' waiting for the device
        self.steps = 0

    def reserve(self, t: float, duration: float) -> float:
        if duration <= 0:
            return t
        start = t if t >= self.free_at else self.free_at
        self.waited_s += start - t
        self.free_at = start + duration
        self.busy_s += duration
        self.steps += 1
        return self.free_at

    def check_integrity(self) -> None:
        assert self.busy_s >= 0 and self.waited_s >= 0, "negative device time"
        assert math.isfinite(self.free_at), "device booked to no end"
        assert self.free_at >= self.busy_s - 1e-9 * max(1, self.steps), "device overbooked"
