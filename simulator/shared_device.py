"""One GPU shared by co-located replicas: how their steps share it.

Processes that share a GPU without MPS are time-sliced: the device runs one context's kernels
at a time. The device's rule (``simulator.device_sharing.DeviceSpec.sharing``) says what that
does to a replica's steps; a plain name is the ``fcfs`` rule.

``fcfs``: first come, first served at step granularity: a step submitted at ``t`` that takes
``d`` seconds alone (its replica's cost model, fitted to the replica alone on the GPU) starts at
``max(t, free_at)`` and holds the device until it ends. A replica's step time then is its wait
plus its own time, as the engine measures it on the wall clock. Host work before a plan (a cost
model's ``wake_delay``) is not booked. Submissions come in time order (a step starts no earlier
than the device's last booked end or the present), so first come is first served.

``timeslice``: steps overlap, and before each of a step's time slices every other replica with
a step in flight runs one slice of its own (fitted to the co-located engine's steps;
``simulator.device_sharing``).

``quantum``: the device's turns are simulated as they run (``simulator.quantum_device``):
``submit`` queues a step and returns an event for its end (``late_ends``), as the engine
learns a step's end only when it is over.
"""

from __future__ import annotations

import math

from horizon.plan import StepPlan
from simulator.device_sharing import DeviceSpec, SliceFit, TimeSlices
from simulator.quantum_device import QuantumDevice


class SharedDevice:
    """The device's bookings; ``reserve`` books a step on it and returns the step's end.

    Contracts:
        * ``reserve(t, d)`` returns the step's end, ``>= t + d``; ``d <= 0`` books nothing and
          returns ``t``. ``fcfs``: ``max(t, free_at) + d``; ``timeslice``: see
          ``TimeSlices.book`` (``plan``: the step's plan; ``now``: the clock at
          submission, ``t`` if not given; ``owner``: the replica booking, never slowed by its
          own steps).
        * ``free_at`` (the latest booked end) never decreases; under ``fcfs`` booked time never
          exceeds it. ``waited_s``: the steps' time beyond their own (waiting or stretched;
          ``fcfs`` and ``timeslice``: a ``quantum`` device's steps are ``submit``-ted, and
          ``turns`` holds that device's own accounts).
    """

    def __init__(self, name: str | DeviceSpec = "gpu0", env=None) -> None:  # noqa: ANN001
        spec = name if isinstance(name, DeviceSpec) else DeviceSpec(name)
        self.spec = spec
        self.name = spec.name
        self._flight: TimeSlices | None = None
        self.turns: QuantumDevice | None = None  # the ``quantum`` rule's device
        if spec.sharing == "timeslice":
            self._flight = TimeSlices(spec.fit or SliceFit.from_file())
        elif spec.sharing == "quantum":
            if env is None:
                raise ValueError(f"SharedDevice {spec.name!r}: sharing='quantum' needs the env")
            assert spec.quantum_s is not None
            self.turns = QuantumDevice(env, spec.quantum_s, spec.switch_s)
        self.free_at = 0.0
        self.busy_s = 0.0  # step time booked (each step's time alone)
        self.waited_s = 0.0  # steps' waiting for the device (fcfs) or for neighbours' slices
        self.steps = 0

    @property
    def late_ends(self) -> bool:
        """A step's end is known when it is over (``submit``), not when booked (``reserve``)."""
        return self.turns is not None

    def submit(self, owner: object, duration: float):  # noqa: ANN201 - a simpy.Event
        """``quantum``: queue a step of ``owner``'s; an event that succeeds with its end."""
        assert self.turns is not None, "submit is the quantum rule's; reserve books the others"
        self.busy_s += max(duration, 0.0)
        self.steps += 1
        return self.turns.submit(owner, duration)

    def reserve(
        self,
        t: float,
        duration: float,
        plan: StepPlan | None = None,
        now: float | None = None,
        owner: object = None,
    ) -> float:
        if duration <= 0:
            return t
        assert self.turns is None, "the quantum rule's steps are submitted, not reserved"
        if self._flight is not None:
            end = self._flight.book(t, duration, plan, t if now is None else now, owner)
            start = end - duration  # the neighbours' slices count as waiting
        else:
            start = t if t >= self.free_at else self.free_at
            end = start + duration
        self.waited_s += max(start - t, 0.0)
        self.free_at = max(self.free_at, end)
        self.busy_s += duration
        self.steps += 1
        return end

    def check_integrity(self) -> None:
        assert self.busy_s >= 0 and self.waited_s >= 0, "negative device time"
        assert math.isfinite(self.free_at), "device booked to no end"
        if self.turns is not None:
            self.turns.check_integrity()
        elif self._flight is None:
            assert self.free_at >= self.busy_s - 1e-9 * max(1, self.steps), "device overbooked"
        else:
            self._flight.check_integrity()
