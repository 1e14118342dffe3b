"""DP groups with MoE expert parallelism: lockstep waves, gate policies, validation."""

from __future__ import annotations

import json

import pytest

import sim
from sim.gate import GATE_POLICIES
from sim.scheduler import Scheduler
from sim.workload import parse_jsonl_lines

MOE = "Qwen/Qwen3-30B-A3B-Instruct-2507"
OPTS = sim.SimOptions(latency_provider="roofline")


def _cluster(members=2, tp=1, ep=2, dp_group="A", model=MOE, tps=None, link_bw=64):
    insts = []
    for m in range(members):
        t = tps[m] if tps else tp
        insts.append({"model_name": model, "hardware": "H100-SXM",
                      "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
                      "num_npus": t, "tp_size": t, "ep_size": ep, "dp_group": dp_group})
    return sim.parse_cluster({"num_nodes": 1, "link_bw": link_bw, "link_latency": 1000, "nodes": [{
        "num_instances": members, "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 0},
        "instances": insts}]})


def _workload(n=24, gap_ns=20_000_000, lengths=(200, 1500)):
    return parse_jsonl_lines(json.dumps({"input_toks": lengths[i % 2], "output_toks": 16 + 4 * i,
                                         "arrival_time_ns": i * gap_ns}) for i in range(n))


def test_dp_group_members_advance_in_lockstep(monkeypatch):
    steps: dict[int, list[int]] = {}
    original = Scheduler.complete

    def recording(self, batch, now, itl):
        steps.setdefault(self.instance_id, []).append(now)
        return original(self, batch, now, itl)

    monkeypatch.setattr(Scheduler, "complete", recording)
    res = sim.simulate(_cluster(), _workload(), OPTS.replace(routing_policy="RR"))
    assert res.summary["num_finished"] == 24
    a, b = set(steps[0]), set(steps[1])
    # Every step of either member ends at a wave boundary; whenever both had work they
    # finished together (an idle member ran a dummy step and has no completion).
    both = a & b
    assert len(both) > 0.5 * min(len(a), len(b))
    independent = sim.simulate(_cluster(dp_group=None, ep=1), _workload(),
                               OPTS.replace(routing_policy="RR"))
    assert independent.summary["num_finished"] == 24


def test_idle_member_slows_nothing_but_runs_dummy_steps():
    # All requests go to member 0 (LOAD ties to the lowest id with sparse arrivals); member 1
    # still joins every wave with a dummy step, so the wave costs at least one all-to-all.
    wl = _workload(n=4, gap_ns=3_000_000_000)
    grouped = sim.simulate(_cluster(link_bw=1), wl, OPTS).requests_table()
    assert set(grouped.instance_id) == {0}
    fast_link = sim.simulate(_cluster(link_bw=400), wl, OPTS).requests_table()
    assert grouped.tpot_ns.mean() > fast_link.tpot_ns.mean()


def test_gate_policies_conserve_assignments_and_register_custom():
    for name in ("BALANCED", "RR", "RAND"):
        gate = GATE_POLICIES.create(name, 0)
        ranks = gate.assign(100, 128, 8, 4)
        assert len(ranks) == 4
        assert sum(a for a, _ in ranks) == 800
        assert all(0 <= act <= 32 for _, act in ranks)

    class AllToRankZero:
        def __init__(self, seed=0):
            pass

        def assign(self, tokens, num_experts, top_k, ep):
            return [(tokens * top_k, num_experts // ep)] + [(0, 0)] * (ep - 1)

    GATE_POLICIES.register("RANK0", AllToRankZero)
    skewed = sim.simulate(_cluster(), _workload(), OPTS.replace(expert_routing_policy="RANK0"))
    balanced = sim.simulate(_cluster(), _workload(), OPTS.replace(expert_routing_policy="BALANCED"))
    # One rank doing all the expert work is slower than a balanced spread.
    assert skewed.summary["tpot_ms"]["mean"] > balanced.summary["tpot_ms"]["mean"]


def test_ep_must_divide_experts_and_group_members_must_match():
    with pytest.raises(sim.InputError, match="does not divide"):
        sim.validate_cluster(_cluster(ep=3), OPTS)
    with pytest.raises(sim.InputError, match="tp_size"):
        sim.validate_cluster(_cluster(tps=[1, 2]), OPTS)
    with pytest.raises(sim.InputError, match="not a mixture-of-experts"):
        sim.validate_cluster(_cluster(model="meta-llama/Llama-3.1-8B"), OPTS)
    with pytest.raises(sim.InputError, match="expert gate policy"):
        sim.simulate(_cluster(), _workload(n=2), OPTS.replace(expert_routing_policy="NOPE"))


def test_expert_parallelism_halves_expert_weights_per_npu():
    model = sim.engine.load_model(MOE)
    assert model.weight_bytes(tp=1, ep=2) < 0.6 * model.weight_bytes(tp=1, ep=1)
