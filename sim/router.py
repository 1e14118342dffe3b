"""Cross-instance request routing policies, looked up by name.

LOAD picks the instance with the smallest vLLM-style load ``waiting * 4 + running``
(ties to the lowest id); RR cycles; RAND picks uniformly with the run's seed. Register a
custom policy with ``ROUTING_POLICIES.register("NAME", factory)`` where ``factory(seed)``
returns an object with ``choose(request, schedulers) -> index``.
"""

from __future__ import annotations

import random
from typing import Protocol

from sim.registry import Registry
from sim.request import Request


class RoutingPolicy(Protocol):
    def choose(self, req: Request, schedulers: list) -> int: ...


ROUTING_POLICIES: Registry[RoutingPolicy] = Registry("routing policy")


@ROUTING_POLICIES.register("LOAD")
class LeastLoad:
    def __init__(self, seed: int = 0) -> None:
        pass

    def choose(self, req: Request, schedulers: list) -> int:
        best, best_load = 0, None
        for i, s in enumerate(schedulers):
            load = s.load()
            if best_load is None or load < best_load:
                best, best_load = i, load
        return best


@ROUTING_POLICIES.register("RR")
class RoundRobin:
    def __init__(self, seed: int = 0) -> None:
        self.next = 0

    def choose(self, req: Request, schedulers: list) -> int:
        i = self.next % len(schedulers)
        self.next += 1
        return i


@ROUTING_POLICIES.register("RAND")
class UniformRandom:
    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def choose(self, req: Request, schedulers: list) -> int:
        return self.rng.randrange(len(schedulers))


@ROUTING_POLICIES.register("LEAST_KV")
class LeastKV:
    """The instance with the lowest KV-cache usage (ties to the lowest id)."""

    def __init__(self, seed: int = 0) -> None:
        pass

    def choose(self, req: Request, schedulers: list) -> int:
        return min(range(len(schedulers)), key=lambda i: (schedulers[i].kv.usage(), i))
