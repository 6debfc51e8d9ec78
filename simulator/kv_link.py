"""The simulator's KV-transfer cost model: bytes over a link, with contention.

A handed-off request's KV is ``num_blocks x block_size x kv_bytes_per_token`` bytes (paged
engines move whole blocks; ``ModelShape.kv_bytes_per_token`` is layers x kv heads x head dim x
2 (K and V) x dtype bytes). A transfer takes the link's fixed ``latency_s`` and then its bytes
at the bandwidth it gets. Every replica has one full-duplex port of ``bandwidth`` bytes/s per
direction; transfers that overlap share it: a transfer's rate is ``bandwidth / max(k_out,
k_in)``, where ``k_out`` transfers leave its source and ``k_in`` enter its target at that
moment, recomputed whenever a transfer starts or ends (an approximation of max-min fair
sharing, exact when all transfers share one source or one target).

Presets (per GPU, per direction; the latencies are this model's assumptions for one transfer's
set-up, not datasheet figures):

    nvlink   450 GB/s   NVLink 4 on H100/H200 SXM: 900 GB/s total bidirectional per GPU
                        (NVIDIA H200 Tensor Core GPU datasheet)
    pcie5     64 GB/s   PCIe Gen5 x16: 32 GT/s x 16 lanes, 128b/130b (PCI-SIG PCIe 5.0)
    rdma      50 GB/s   one 400 Gb/s InfiniBand NDR port per GPU (NVIDIA ConnectX-7 datasheet)

``same_gpu`` (two replicas on one GPU, a device-to-device copy through CUDA IPC) has no
datasheet figure: ``measured_link`` reads the fit to the engine's measured block copies
(``python -m executor.kv_transfer_bench``; ``calibration/h200_kv_transfer.json``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import simpy

_Fn = Callable[[simpy.Event], None]


@dataclass(frozen=True)
class LinkSpec:
    """A link: ``bandwidth`` bytes/s per direction per port, ``latency_s`` per transfer."""

    name: str
    bandwidth: float
    latency_s: float
    source: str = ""

    def __post_init__(self) -> None:
        if not (isinstance(self.bandwidth, (int, float)) and math.isfinite(self.bandwidth)):
            raise ValueError(f"LinkSpec.bandwidth must be a finite number, got {self.bandwidth!r}")
        if self.bandwidth <= 0:
            raise ValueError(f"LinkSpec.bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")
        if not (isinstance(self.latency_s, (int, float)) and 0 <= self.latency_s < math.inf):
            raise ValueError(f"LinkSpec.latency_s must be a number >= 0, got {self.latency_s!r}")

    def time(self, nbytes: float) -> float:
        """Seconds one transfer of ``nbytes`` takes alone on the link."""
        return self.latency_s + nbytes / self.bandwidth

    @classmethod
    def fit(cls, name: str, nbytes: Sequence[float], seconds: Sequence[float], source: str = ""):  # noqa: ANN206
        """Least-squares ``seconds = latency + bytes / bandwidth`` over measured transfers."""
        x, y = np.asarray(nbytes, dtype=float), np.asarray(seconds, dtype=float)
        if len(x) < 2 or np.ptp(x) == 0:
            raise ValueError("LinkSpec.fit needs transfers of at least two different sizes")
        slope, icpt = np.polyfit(x, y, 1)
        if slope <= 0:
            raise ValueError(f"LinkSpec.fit: time does not grow with bytes (slope {slope:.3g})")
        return cls(name, float(1.0 / slope), float(max(icpt, 0.0)), source)


LINKS = {
    "nvlink": LinkSpec("nvlink", 450e9, 10e-6, "NVIDIA H200 datasheet: NVLink 900 GB/s"),
    "pcie5": LinkSpec("pcie5", 64e9, 10e-6, "PCI-SIG PCIe 5.0 x16"),
    "rdma": LinkSpec("rdma", 50e9, 20e-6, "NVIDIA ConnectX-7: 400 Gb/s NDR"),
}


def measured_link(path: str, shape: str, name: str = "same_gpu") -> LinkSpec:
    """The link fitted to measured KV block copies of model ``shape`` (a kv_transfer_bench
    JSON file): its latency and bandwidth."""
    with open(path) as f:
        doc = json.load(f)
    if shape not in doc.get("shapes", {}):
        known = ", ".join(sorted(doc.get("shapes", {})))
        raise ValueError(f"measured_link: shape {shape!r} not in {path}; measured: {known}")
    fit = doc["shapes"][shape]["fit"]
    if not fit.get("bandwidth_Bps"):
        raise ValueError(f"measured_link: {path} has no bandwidth fit for {shape!r}")
    source = f"{path}: {doc.get('gpu', '?')}, {doc.get('date', '?')}"
    return LinkSpec(name, float(fit["bandwidth_Bps"]), float(fit["latency_s"]), source)


def link_spec(name: str) -> LinkSpec:
    if name not in LINKS:
        raise ValueError(f"unknown link {name!r}; known: {', '.join(sorted(LINKS))}")
    return LINKS[name]


class _Call(simpy.events.Event):
    """An event, triggered at creation, that runs ``fn(event)`` when processed: one SimPy
    event in place of a process's step (no generator to resume)."""

    def __init__(self, env: simpy.Environment, delay: float, urgent: bool, fn: _Fn) -> None:
        self.env = env
        self.callbacks = [fn]
        self._value = None
        self._ok = True
        env.schedule(self, simpy.events.URGENT if urgent else simpy.events.NORMAL, delay)


def later(env: simpy.Environment, delay: float, fn: _Fn) -> simpy.Event:
    """``fn(event)`` at ``now + delay``, ordered as a process's ``env.timeout(delay)`` is."""
    assert delay >= 0, delay
    return _Call(env, delay, False, fn)


def soon(env: simpy.Environment, fn: _Fn) -> None:
    """``fn(event)`` now, where a process started now would take its first step (SimPy's
    ``Initialize``: after the running one yields and the processes started before it, ahead
    of every ordinary event of now)."""
    _Call(env, 0, True, fn)


class _Flow:
    __slots__ = ("src", "dst", "left", "rate", "done")

    def __init__(self, src: int, dst: int, nbytes: float, done: Callable[[], None]) -> None:
        self.src, self.dst, self.left, self.rate, self.done = src, dst, float(nbytes), 0.0, done


class Fabric:
    """Transfers between replicas' ports under ``link`` (see the module docstring), on callbacks
    scheduled in the run's environment: no SimPy process per transfer. The one wake-up that
    counts is the latest scheduled (``_wake``); one scheduled before it finds itself stale."""

    def __init__(self, env: simpy.Environment, link: LinkSpec) -> None:
        self.env = env
        self.link = link
        self._flows: list[_Flow] = []
        self._since = 0.0
        self._wake: simpy.Event | None = None
        self.bytes_sent = 0.0

    def send(self, src: int, dst: int, nbytes: float, done: Callable[[], None]) -> None:
        """Send ``nbytes`` from ``src`` to ``dst`` from now: after the link's latency they share
        the ports; ``done()`` runs when they are in (finishing flows in the order they began)."""
        if self.link.latency_s > 0:
            later(self.env, self.link.latency_s, lambda _ev: self._begin(src, dst, nbytes, done))
        else:
            self._begin(src, dst, nbytes, done)

    def _begin(self, src: int, dst: int, nbytes: float, done: Callable[[], None]) -> None:
        if nbytes <= 0:  # nothing to carry: over at the next ordinary event of now
            later(self.env, 0, lambda _ev: done())
            return
        self._advance()
        self._flows.append(_Flow(src, dst, nbytes, done))
        self.bytes_sent += nbytes
        self._reschedule()

    def _advance(self) -> None:
        """Drain every flow by what it sent since the last change."""
        dt = self.env.now - self._since
        if dt > 0:
            for f in self._flows:
                f.left -= f.rate * dt
        self._since = self.env.now

    def _reschedule(self) -> None:
        flows = self._flows
        if len(flows) == 1:  # alone: the full bandwidth (the general case's arithmetic)
            f = flows[0]
            f.rate = self.link.bandwidth / 1
            self._wake = later(self.env, max(f.left, 0.0) / f.rate, self._woke)
            return
        out: dict[int, int] = {}
        into: dict[int, int] = {}
        for f in self._flows:
            out[f.src] = out.get(f.src, 0) + 1
            into[f.dst] = into.get(f.dst, 0) + 1
        bw = self.link.bandwidth
        for f in self._flows:
            f.rate = bw / max(out[f.src], into[f.dst])
        self._wake = None
        if self._flows:
            nxt = min(max(f.left, 0.0) / f.rate for f in self._flows)
            self._wake = later(self.env, nxt, self._woke)

    def _woke(self, ev: simpy.Event) -> None:
        if ev is not self._wake:
            return  # a later start or end rescheduled
        self._advance()
        tol = 1e-9 * self.link.bandwidth  # bytes a nanosecond carries: float slack
        finished = [f for f in self._flows if f.left <= tol]
        self._flows = [f for f in self._flows if f.left > tol]
        self._reschedule()
        if not finished:
            return
        env = self.env
        if env.peek() > env.now:  # nothing else falls on this instant: no order to keep
            self._done(finished)
        else:  # after what falls on it: two ordinary events of now on (a done event, a send's end)
            later(env, 0, lambda _ev: self._done_next(finished))

    def _done_next(self, finished: list[_Flow]) -> None:
        later(self.env, 0, lambda _ev: self._done(finished))

    @staticmethod
    def _done(finished: list[_Flow]) -> None:
        for f in finished:
            f.done()

    @property
    def active(self) -> int:
        return len(self._flows)

    def check_integrity(self) -> None:
        assert all(f.rate > 0 for f in self._flows), "a flow without bandwidth"
        assert (self._wake is None) == (not self._flows), "flows without a wake-up"
        assert self.bytes_sent >= 0
