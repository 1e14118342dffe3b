"""Routing policies: LOAD, RR, RAND, LEAST_KV, custom registration, unknown names."""

from __future__ import annotations

import pytest
from sim_testkit import flat_workload, make_cluster

import sim
from sim.errors import InputError
from sim.kv_cache import KVCacheManager
from sim.request import Request
from sim.router import ROUTING_POLICIES


class FakeSched:
    def __init__(self, waiting: int = 0, running: int = 0, used_blocks: int = 0) -> None:
        self.waiting = [object()] * waiting
        self.running = [object()] * running
        self.kv = KVCacheManager(11, 16, False)
        for _ in range(used_blocks):
            self.kv.free.popleft()

    def load(self) -> int:  # the real Scheduler.load formula
        return len(self.waiting) * 4 + len(self.running)


def _req(i: int = 0) -> Request:
    return Request(i, 0, 10, 2)


def test_scheduler_load_formula():
    from sim.options import SimOptions
    from sim.scheduler import Scheduler
    s = Scheduler(0, SimOptions(), KVCacheManager(10, 16, False))
    for r in range(3):
        s.add_request(_req(r))
    s.running = [_req(10), _req(11)]
    assert s.load() == 3 * 4 + 2


def test_load_picks_min_waiting_times_4_plus_running():
    pol = ROUTING_POLICIES.create("LOAD", 0)
    # loads: 1*4+0=4, 0*4+3=3, 0*4+5=5  -> index 1
    scheds = [FakeSched(1, 0), FakeSched(0, 3), FakeSched(0, 5)]
    assert pol.choose(_req(), scheds) == 1
    # waiting weighs 4x: 1 waiting (4) loses to 3 running (3), but beats 5 running
    scheds = [FakeSched(0, 5), FakeSched(1, 0)]
    assert pol.choose(_req(), scheds) == 1


def test_load_ties_go_to_lowest_index():
    pol = ROUTING_POLICIES.create("LOAD", 0)
    scheds = [FakeSched(0, 4), FakeSched(1, 0), FakeSched(0, 4)]
    assert pol.choose(_req(), scheds) == 0
    assert pol.choose(_req(), [FakeSched(), FakeSched()]) == 0


def test_rr_cycles():
    pol = ROUTING_POLICIES.create("RR", 123)
    scheds = [FakeSched(), FakeSched(9, 9), FakeSched()]
    picks = [pol.choose(_req(i), scheds) for i in range(7)]
    assert picks == [0, 1, 2, 0, 1, 2, 0]


def test_rand_is_deterministic_per_seed_and_uniformish():
    scheds = [FakeSched() for _ in range(4)]
    a = ROUTING_POLICIES.create("RAND", 7)
    b = ROUTING_POLICIES.create("RAND", 7)
    c = ROUTING_POLICIES.create("RAND", 8)
    pa = [a.choose(_req(i), scheds) for i in range(400)]
    pb = [b.choose(_req(i), scheds) for i in range(400)]
    pc = [c.choose(_req(i), scheds) for i in range(400)]
    assert pa == pb
    assert pa != pc
    assert set(pa) == {0, 1, 2, 3}
    for k in range(4):
        assert 60 <= pa.count(k) <= 140


def test_least_kv_picks_lowest_usage():
    pol = ROUTING_POLICIES.create("LEAST_KV", 0)
    scheds = [FakeSched(used_blocks=5), FakeSched(used_blocks=2), FakeSched(used_blocks=2)]
    assert pol.choose(_req(), scheds) == 1


def test_unknown_policy_lists_valid_names():
    with pytest.raises(InputError) as ei:
        ROUTING_POLICIES.create("NOPE", 0, source="--request-routing-policy")
    msg = str(ei.value)
    assert "NOPE" in msg and "--request-routing-policy" in msg
    for name in ("LOAD", "RR", "RAND"):
        assert name in msg


def test_unknown_policy_in_simulation(bundle_root):
    from sim_testkit import opts_for
    with pytest.raises(InputError, match="unknown routing policy 'BOGUS'.*LOAD"):
        sim.simulate(make_cluster(100, instances=2),
                     flat_workload([(0, 10, 2)]), opts_for(bundle_root, routing_policy="BOGUS"))


def test_custom_registered_policy_is_used_by_name(bundle_root):
    from sim_testkit import opts_for
    calls = []

    class LastInstance:
        def __init__(self, seed: int = 0) -> None:
            self.seed = seed

        def choose(self, req, schedulers) -> int:
            calls.append(req.rid)
            return len(schedulers) - 1

    ROUTING_POLICIES.register("TEST_LAST", LastInstance)
    try:
        w = flat_workload([(i * 1000, 20, 3) for i in range(6)])
        r = sim.simulate(make_cluster(100, instances=3), w,
                         opts_for(bundle_root, routing_policy="TEST_LAST"))
    finally:
        ROUTING_POLICIES._factories.pop("TEST_LAST", None)
    t = r.requests_table()
    assert sorted(calls) == list(range(6))
    assert (t.instance_id == 2).all()


def test_rr_spreads_requests_over_instances_in_simulation(bundle_root):
    from sim_testkit import opts_for
    w = flat_workload([(i * 1000, 20, 3) for i in range(9)])
    r = sim.simulate(make_cluster(100, instances=3), w, opts_for(bundle_root, routing_policy="RR"))
    t = r.requests_table()
    assert list(t.instance_id) == [0, 1, 2] * 3


def test_load_balances_simultaneous_arrivals(bundle_root):
    """All arriving at t=0 are routed before any scheduling: waiting counts balance them."""
    from sim_testkit import opts_for
    w = flat_workload([(0, 20, 3) for _ in range(8)])
    r = sim.simulate(make_cluster(100, instances=2), w, opts_for(bundle_root, routing_policy="LOAD"))
    counts = r.requests_table().instance_id.value_counts().to_dict()
    assert counts == {0: 4, 1: 4}
