"""A stated, seeded acceptance model for speculative decoding, shared by the simulator and the
engine (where the target has random weights, ``EngineConfig.acceptance``: the number of
accepted drafts is drawn from this model instead of compared with the target's argmax).

Draft position ``i`` (1-based) is accepted with probability ``rates[i-1]`` given that drafts
``1..i-1`` were (the last rate repeats for later positions), so with one rate ``alpha`` the
first ``i`` drafts are all accepted with probability ``alpha**i`` and a verification of ``k``
drafts emits ``1 + alpha + ... + alpha**k`` tokens on average.

Sampling is per request per step and vectorised: one uniform ``u`` per verification, and the
accepted count is the number of positions ``i <= k`` whose all-accepted probability exceeds
``u``. ``u`` is a hash of (seed, request id, tokens the request has emitted): it depends on
where the request is in its output, not on the step, the batch or the order of the plan, so
two runs that differ only in ``k`` or in scheduling see the same draws (common random
numbers), and a larger ``k`` never accepts fewer drafts at the same position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from horizon.request import Request

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK = 0xFFFFFFFFFFFFFFFF


def _mix_int(x: int) -> int:
    """``_mix`` of one uint64, in Python ints."""
    x = ((x ^ (x >> 30)) * int(_M1)) & _MASK
    x = ((x ^ (x >> 27)) * int(_M2)) & _MASK
    return x ^ (x >> 31)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class AcceptanceModel:
    """Per-position acceptance rates, stated; ``seed`` picks the draws.

    Attributes:
        rates: conditional acceptance of draft positions 1, 2, ... (each in [0, 1]); the last
            applies to every later position.
        seed: an int; the same seed gives the same accepted counts for the same requests.
    """

    rates: tuple[float, ...] = (0.7,)
    seed: int = 0
    _survival: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rates = tuple(self.rates)
        if not rates or not all(isinstance(a, (int, float)) and 0 <= a <= 1 for a in rates):
            raise ValueError(f"AcceptanceModel.rates must be numbers in [0, 1], got {rates!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"AcceptanceModel.seed must be an int, got {self.seed!r}")
        object.__setattr__(self, "rates", rates)
        object.__setattr__(self, "_survival", self.survival(64))

    @classmethod
    def geometric(cls, alpha: float, seed: int = 0) -> AcceptanceModel:
        """Every position accepted with probability ``alpha`` given the ones before it."""
        return cls((alpha,), seed)

    @classmethod
    def from_spec(cls, spec: object, seed: int = 0) -> AcceptanceModel:
        """A model from ``("geometric", alpha)``, ``("rates", (r1, r2, ...))`` (each optionally
        with a third item, the seed; else ``seed``) or an ``AcceptanceModel`` (as is)."""
        if isinstance(spec, AcceptanceModel):
            return spec
        if isinstance(spec, (tuple, list)) and len(spec) in (2, 3):
            kind, value, *rest = spec
            s = rest[0] if rest else seed
            if kind == "geometric" and isinstance(value, (int, float)):
                return cls.geometric(float(value), s)
            if kind == "rates" and isinstance(value, (tuple, list)):
                return cls(tuple(value), s)
        raise ValueError(
            f"acceptance must be ('geometric', alpha), ('rates', (r1, ...)) or an "
            f"AcceptanceModel, got {spec!r}"
        )

    @property
    def label(self) -> str:
        """How results name it: ``stated acceptance α=0.7 (seed 0)``."""
        rates = ",".join(f"{a:g}" for a in self.rates)
        return f"stated acceptance α={rates} (seed {self.seed})"

    def survival(self, k: int) -> np.ndarray:
        """P(drafts 1..i all accepted) for i = 1..k."""
        r = np.array([self.rates[min(i, len(self.rates) - 1)] for i in range(k)], dtype=float)
        return np.cumprod(r)

    def expected_tokens(self, k: int) -> float:
        """Mean tokens a verification of ``k`` drafts emits: 1 + sum of ``survival(k)``."""
        return 1.0 + float(self.survival(k).sum())

    def sample(self, verifies: Sequence[tuple[Request, int]]) -> np.ndarray:
        """Accepted drafts (``0..k``) for each ``(request, k)``, from the pre-step counters."""
        n = len(verifies)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        ids = np.fromiter((r.request_id for r, _ in verifies), np.uint64, n)
        pos = np.fromiter((r.num_output_tokens for r, _ in verifies), np.uint64, n)
        ks = np.fromiter((k for _, k in verifies), np.int64, n)
        return np.minimum(self._hits(self._uniforms(ids, pos), int(ks.max())), ks)

    def hits(self, request_id: int, start: int, stop: int, kmax: int) -> np.ndarray:
        """Drawn ahead: the accepted drafts of a verification of ``kmax`` drafts by request
        ``request_id`` at each output position ``start .. stop - 1`` (``num_output_tokens``
        before the step), the draws ``sample`` makes there; ``min(hits, k)`` is the draw for
        any ``k <= kmax`` (a larger ``k`` never accepts fewer)."""
        x = np.arange(start, max(start, stop), dtype=np.uint64)
        return self._drawn(x, np.uint64(self._key(request_id)), kmax)

    def hits_many(
        self, request_ids: Sequence[int], lengths: Sequence[int], kmax: int
    ) -> np.ndarray:
        """``hits`` at positions ``0 .. lengths[i] - 1`` of each request, concatenated."""
        n = np.asarray(lengths, dtype=np.int64)
        total = int(n.sum())
        starts = np.concatenate(([0], np.cumsum(n)[:-1]))
        pos = np.arange(total, dtype=np.int64) - np.repeat(starts, n)
        keys = np.repeat(np.array([self._key(i) for i in request_ids], dtype=np.uint64), n)
        return self._drawn(pos.astype(np.uint64), keys, kmax)

    def _key(self, request_id: int) -> int:
        """The first mix of ``_uniforms`` for one id, in Python ints (the same wrapping uint64
        arithmetic)."""
        return _mix_int(((self.seed & _MASK) * int(_GOLDEN) + request_id) & _MASK)

    def _drawn(self, x: np.ndarray, key: np.ndarray | np.uint64, kmax: int) -> np.ndarray:
        """``_hits(_uniforms)`` from the positions ``x`` (overwritten) and the ids' keys, in
        place; the hits by counting the survivals above each ``u`` (by bisection for many
        drafts: ``survival`` never increases)."""
        x *= _GOLDEN
        x ^= key
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
        x >>= np.uint64(11)
        u = x.astype(np.float64)
        u *= 1.0 / (1 << 53)
        surv = self._survival if kmax <= len(self._survival) else self.survival(kmax)
        if kmax > 8:
            return kmax - np.searchsorted(surv[:kmax][::-1], u, side="right")
        out = np.zeros(u.shape, dtype=np.int64)  # few drafts: a comparison each is faster
        for p in surv[:kmax].tolist():
            out += u < p
        return out

    def _uniforms(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """``u`` in [0, 1) per (request id, output position): the hash of the module docstring."""
        with np.errstate(over="ignore"):
            x = _mix(np.uint64(self.seed & 0xFFFFFFFFFFFFFFFF) * _GOLDEN + ids) ^ pos * _GOLDEN
            return (_mix(x) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))

    def _hits(self, u: np.ndarray, kmax: int) -> np.ndarray:
        """Positions ``i <= kmax`` whose all-accepted probability exceeds each ``u``."""
        surv = self._survival if kmax <= len(self._survival) else self.survival(kmax)
        return (u[:, None] < surv[None, :kmax]).sum(axis=1)
