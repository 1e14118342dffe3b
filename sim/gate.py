"""MoE expert-gate policies: how an iteration's tokens spread over expert-parallel ranks.

A policy turns ``tokens`` tokens (each routed to ``top_k`` of ``num_experts`` experts)
into, per EP rank, the number of token-expert assignments it receives and the number of
its local experts that are activated. Ranks own contiguous expert ranges of
``num_experts / ep`` experts. Register a custom policy with
``GATE_POLICIES.register("NAME", factory)``; ``factory(seed)`` returns an object with
``assign(tokens, num_experts, top_k, ep) -> list[tuple[int, int]]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.registry import Registry

if TYPE_CHECKING:
    import numpy as np

GATE_POLICIES: Registry = Registry("expert gate policy")


def _per_rank(counts: np.ndarray, ep: int) -> list[tuple[int, int]]:
    """(assignments, activated experts) of each rank's contiguous range of ``counts``
    (two reductions over all ranks at once: numpy's per-call cost, not the arithmetic,
    is what a step pays here)."""
    import numpy as np

    per = counts.reshape(ep, -1)
    return list(zip(per.sum(axis=1).tolist(), np.count_nonzero(per, axis=1).tolist()))


@GATE_POLICIES.register("BALANCED")
class Balanced:
    """Every rank receives the same share; activated experts follow the expected number of
    distinct experts hit by that many uniform assignments."""

    def __init__(self, seed: int = 0) -> None:
        pass

    def assign(self, tokens: int, num_experts: int, top_k: int, ep: int) -> list[tuple[int, int]]:
        total = tokens * top_k
        local = num_experts // ep
        out = []
        for r in range(ep):
            a = total // ep + (1 if r < total % ep else 0)
            active = round(local * (1.0 - (1.0 - 1.0 / local) ** a)) if a else 0
            out.append((a, max(1 if a else 0, min(local, active))))
        return out


@GATE_POLICIES.register("RR")
class RoundRobin:
    """Assignments go to experts in turn, continuing across iterations."""

    def __init__(self, seed: int = 0) -> None:
        self.next = 0

    def assign(self, tokens: int, num_experts: int, top_k: int, ep: int) -> list[tuple[int, int]]:
        import numpy as np

        total = tokens * top_k
        counts = np.full(num_experts, total // num_experts, dtype=np.int64)
        rest = total % num_experts
        idx = (self.next + np.arange(rest)) % num_experts
        np.add.at(counts, idx, 1)
        self.next = (self.next + rest) % num_experts
        return _per_rank(counts, ep)


@GATE_POLICIES.register("RAND")
class UniformRandom:
    """Each assignment picks an expert uniformly at random (seeded)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = None  # made at the first draw: a dense model's run never imports numpy

    @property
    def rng(self):
        if self._rng is None:
            import numpy as np

            self._rng = np.random.default_rng(self.seed)
        return self._rng

    def assign(self, tokens: int, num_experts: int, top_k: int, ep: int) -> list[tuple[int, int]]:
        import numpy as np

        counts = np.bincount(self.rng.integers(0, num_experts, size=tokens * top_k),
                             minlength=num_experts)
        return _per_rank(counts, ep)
