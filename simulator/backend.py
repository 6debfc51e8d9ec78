"""The simulator's backend: executes a plan by asking the cost model how long it takes.

Its stopping rule is the trace's (``horizon.trace_stop``): a request stops when it has emitted
``true_output_tokens``. It implements ``horizon.serving_loop.Backend`` on a simulated clock:
serially, a step's modelled duration passes on the clock; pipelined, a step starts when the
one before it ends (or at once) and its end is known when it is submitted.

Speculative decoding: a plan's verifies get their accepted drafts from the stated
``acceptance`` model (``horizon.acceptance``), capped by the trace's stopping rule. With
``drawn`` (the scheduler draws acceptance ahead from the same model, ``Scheduler.draws_ahead``)
the plans carry their verifies' tracks and the stopping rule follows them
(``simulator.drawn_stop``): a step's result then lists only the capped counts.
"""

from __future__ import annotations

import math
from typing import Any

from horizon.acceptance import AcceptanceModel
from horizon.drawn_verifies import DrawnAccepted, DrawnVerifies
from horizon.plan import StepPlan, StepResult, new_result
from horizon.serving_loop import Clock, InFlight
from horizon.trace_stop import TraceStop
from simulator.cost_model import CostModel, fresh_cost_model
from simulator.drawn_stop import DrawnStop
from simulator.shared_device import SharedDevice


class SimBackend:
    """``execute(plan) -> StepResult`` (and ``submit``/``wait``); never touches scheduler state.

    A cost model with a ``wake_delay(step, now) -> float`` method models the engine's host
    work before a plan: consulted after an idle sleep (and the run's start), or before every
    plan when ``pipelined`` (see ``simulator.Simulation``).

    ``device``: a GPU this replica shares with others (``simulator.shared_device``); a step's
    device work then waits until the device is free (or is stretched by the steps sharing
    it), and its duration includes that; the device is told the plan, the clock at submission
    and which replica books (``id(self)``).

    ``acceptance``: how many drafts a verification accepts (needed for plans that verify; a
    plan with verifies and no model is a ValueError). ``drawn``: the scheduler draws it ahead
    (see the module docstring); event mode only."""

    advances_clock = True

    def __init__(
        self,
        cost_model: CostModel,
        event_mode: bool = True,
        clock: Clock | None = None,
        pipelined: bool = False,
        device: SharedDevice | None = None,
        acceptance: AcceptanceModel | None = None,
        drawn: bool = False,
    ) -> None:
        if device is not None and clock is None:
            raise ValueError("SimBackend.device needs the clock")
        if drawn and (acceptance is None or not event_mode):
            raise ValueError("SimBackend.drawn needs the acceptance model and event mode")
        self.cost_model = fresh_cost_model(cost_model)  # its own state, where it has one
        self.device = device
        self.clock = clock
        self.pipelined = pipelined
        self._stop = TraceStop(event_mode)
        self._drawn = DrawnStop() if drawn else None
        self.acceptance = acceptance
        self._wake_delay = getattr(self.cost_model, "wake_delay", None)
        # pipelined: the latest non-empty step's end (a step starts at max(now, this))
        self._last_end: float | None = None
        self._held_until = -math.inf  # ``hold``: the host waits until then
        self._held_event: Any = None  # ``hold_on``: the host waits for it (late-end devices)
        self._late = device is not None and device.late_ends
        if self._late and not pipelined:
            raise ValueError(
                f"SimBackend: device {device.name!r} (sharing='quantum') needs the pipelined loop"
            )
        # the serving loop's hook (``horizon.serving_loop``): only a late-end device's host
        # waits on work whose end is not known yet (``hold_on``)
        self.held = self._held if self._late else None

    def execute(self, plan: StepPlan) -> StepResult:
        if plan.verifies or self._drawn is not None:
            if self._drawn is not None:
                return self._drawn_step(plan, serial=True)
            return self._speculative(plan, serial=True)
        finished = self._stop.finished(plan)
        duration = self.cost_model.step_time(plan)
        if self.device is not None:
            now = self.clock.now()  # type: ignore[union-attr]
            duration = self.device.reserve(now, duration, plan, now, id(self)) - now
        return new_result(duration, tuple(finished))

    def _speculative(self, plan: StepPlan, serial: bool) -> StepResult:
        """A plan that verifies drafts: accepted counts sampled, capped by the trace."""
        if self.acceptance is None:
            raise ValueError("SimBackend.acceptance: a plan verifies drafts but no model is set")
        accepted = self._stop.cap(plan.verifies, self.acceptance.sample(plan.verifies).tolist())
        finished = self._stop.finished(plan, accepted)
        duration = self.cost_model.step_time(plan)
        if serial and self.device is not None:
            now = self.clock.now()  # type: ignore[union-attr]
            duration = self.device.reserve(now, duration, plan, now, id(self)) - now
        return new_result(duration, tuple(finished), tuple(accepted))

    def _drawn_step(self, plan: StepPlan, serial: bool) -> StepResult:
        """A plan of a scheduler that draws acceptance ahead: finishes and capped counts from
        the tracks (``DrawnStop``)."""
        assert self._drawn is not None
        finished, capped = self._drawn.finished(plan)
        duration = self.cost_model.step_time(plan)
        if serial and self.device is not None:
            now = self.clock.now()  # type: ignore[union-attr]
            duration = self.device.reserve(now, duration, plan, now, id(self)) - now
        v = plan.verifies
        if v.__class__ is DrawnVerifies:
            return new_result(duration, tuple(finished), DrawnAccepted(v, capped))  # type: ignore[arg-type]
        return new_result(duration, tuple(finished))

    def host_delay(self, step: int, now: float, woke: bool) -> float:
        held = self._held_until - now  # > 0: the host still waits on work it queued (``hold``)
        if self._wake_delay is None or not (woke or self.pipelined):
            return held if held > 0.0 else 0.0
        d = self._wake_delay(step, now)
        return held if held > d else d

    def busy_until(self, now: float) -> float:
        """When the step in flight ends (``now`` if none): work queued behind it on the
        replica's stream starts then. Known at submission only (not on a late-end device)."""
        if self._late:
            raise ValueError(f"SimBackend.busy_until: device {self.device.name!r} "  # type: ignore[union-attr]
                             "(sharing='quantum') knows a step's end only as it runs")  # fmt: skip
        last = self._last_end
        return last if last is not None and last > now else now

    def hold(self, until: float) -> None:
        """The replica's host is busy until ``until`` (waiting on work it queued, such as KV
        copies): a plan before then waits for it (``host_delay``)."""
        if until > self._held_until:
            self._held_until = until

    @property
    def late_ends(self) -> bool:
        """Whether this replica's steps end when its device's turns say (``sharing='quantum'``)."""
        return self._late

    def queue(self, duration: float) -> Any:
        """Device work of ``duration`` s alone (a KV copy) behind this replica's steps in
        flight on a late-end device; returns the device's event, which succeeds with its end."""
        if not self._late:
            raise ValueError("SimBackend.queue: only on a late-end device; elsewhere busy_until")
        return self.device.submit(id(self), duration)  # type: ignore[union-attr]

    def hold_on(self, event: Any) -> None:
        """The host waits for ``event`` (work it queued, ending when the device says) before
        its next plan; a later call replaces an earlier one (queued work ends in order)."""
        if not self._late:
            raise ValueError("SimBackend.hold_on: only on a late-end device; elsewhere hold")
        self._held_event = event

    def _held(self) -> Any:
        event = self._held_event
        if event is None or event.processed:
            self._held_event = None
            return None
        return event

    def drains_before(self, plan: StepPlan) -> bool:
        return False  # the cost model prices a drain (its ``preempting`` term)

    def submit(self, plan: StepPlan) -> InFlight:
        clock = self.clock
        assert clock is not None, "a pipelined SimBackend needs the clock"
        if plan.verifies or self._drawn is not None:
            if self._drawn is not None:
                result = self._drawn_step(plan, serial=False)
            else:
                result = self._speculative(plan, serial=False)
        else:  # priced: the step's duration, its finished requests under the trace's rule
            finished = self._stop.finished(plan)
            result = new_result(self.cost_model.step_time(plan), tuple(finished))
        now = clock.now()
        if self._late:  # the device's turns say when it ends
            return self._submit_late(plan, result)
        last = self._last_end
        start = last if last is not None and last > now else now  # max(now, last)
        if self.device is None:
            d = result.duration
            end = start + (0.0 if d < 0.0 else d)  # max(d, 0.0)
        else:
            end = self.device.reserve(start, result.duration, plan, now, id(self))
        self._last_end = None if plan.is_empty else end
        return InFlight(plan, result, end, False)

    def _submit_late(self, plan: StepPlan, result: StepResult) -> InFlight:
        """A step on a device whose turns are simulated as they run: queued there, its end
        set when the device's event for it succeeds (``wait`` returns that event)."""
        assert self.device is not None
        event = self.device.submit(id(self), 0.0 if plan.is_empty else result.duration)
        step = InFlight(plan, result, None, True, event)
        if event.triggered:
            step.end = event.value
        else:
            event.callbacks.append(lambda ev: setattr(step, "end", ev.value))
        return step

    def wait(self, step: InFlight) -> Any:
        if step.end is None:  # a late end: the device's event (end set when it succeeds)
            return step.token
        assert self.clock is not None
        return self.clock.until(step.end) if step.end > self.clock.now() else None

    def when_over(self, waitable: Any, callback: Any) -> None:
        """Call ``callback()`` once ``waitable`` (a late end's event, from ``wait``) is over
        and the step's end is set."""
        waitable.callbacks.append(lambda _ev: callback())

    def check_integrity(self) -> None:
        """Stateless between steps but for the shared device's bookings and the cost model's
        own state (where it has one)."""
        if self.device is not None:
            self.device.check_integrity()
        check = getattr(self.cost_model, "check_integrity", None)
        if check is not None:
            check()
