"""The system-backend boundary: time one iteration of one instance.

The engine hands the backend an instance and the iteration's per-layer compute trace;
the backend returns the iteration's duration in ns (= cycles). ``AnalyticalBackend``
(in-process, the default) adds the tensor-parallel all-reduces to the compute time with
the ring all-reduce cost of the instance's intra-node links. The ASTRA-Sim-compatible
backends (in-process engine and subprocess) implement the same two methods.
"""

from __future__ import annotations

import math
from typing import Protocol

from sim.latency.base import BatchShape, LayerTimes
from sim.model import TP_ALLREDUCE_AFTER


class InstanceRuntime(Protocol):
    instance_id: int
    tp: int
    pp: int
    provider: object
    model: object


class SystemBackend(Protocol):
    name: str

    def iteration_ns(self, inst: InstanceRuntime, shape: BatchShape) -> int: ...

    def close(self) -> None: ...


def ring_allreduce_ns(size_bytes: float, n: int, bw_GBps: float, latency_ns: float) -> float:
    """Ring all-reduce on n NPUs: 2(n-1) steps, each moving size/n bytes over one link."""
    if n <= 1:
        return 0.0
    bytes_per_ns = bw_GBps * (1 << 30) / 1e9
    step = latency_ns + (size_bytes / n) / bytes_per_ns
    return 2 * (n - 1) * step


class AnalyticalBackend:
    """Compute from the latency provider plus closed-form TP all-reduces."""

    name = "inproc"

    def __init__(self, link_bw_GBps: float, link_latency_ns: float) -> None:
        self.link_bw = link_bw_GBps
        self.link_latency = link_latency_ns

    def iteration_ns(self, inst: InstanceRuntime, shape: BatchShape) -> int:
        provider = inst.provider
        if inst.tp == 1 and inst.pp == 1:
            fast = getattr(provider, "iteration_ns", None)
            if fast is not None:
                return fast(shape)
            return provider.layer_times(shape).total_ns()
        lt: LayerTimes = provider.layer_times(shape)
        total = lt.total_ns()
        if inst.tp > 1:
            act_bytes = shape.num_tokens * inst.model.hidden_size * inst.model.dtype_bytes
            ar = ring_allreduce_ns(act_bytes, inst.tp, self.link_bw, self.link_latency)
            per_block = sum(1 for name, _ in lt.block if name in TP_ALLREDUCE_AFTER)
            total += math.ceil(ar) * per_block * lt.num_blocks
        if inst.pp > 1:
            # Activations cross pp-1 stage boundaries, one point-to-point send each.
            act_bytes = shape.num_tokens * inst.model.hidden_size * inst.model.dtype_bytes
            bytes_per_ns = self.link_bw * (1 << 30) / 1e9
            total += (inst.pp - 1) * math.ceil(self.link_latency + act_bytes / bytes_per_ns)
        return int(total)

    def close(self) -> None:
        pass
