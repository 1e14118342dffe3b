"""Power and energy: the time series integrates to the total, components add up, and
partial power blocks are refused."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.workload import parse_jsonl_lines
from sim_testkit import POWER



def _cluster(nodes=1, tp=1, power=True, partial=False):
    node = {"num_instances": 1, "cpu_mem": {"mem_size": 128, "mem_bw": 64, "mem_latency": 0},
            "instances": [{"model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
                           "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
                           "num_npus": tp, "tp_size": tp}]}
    ns = []
    for i in range(nodes):
        n = copy.deepcopy(node)
        if power and not (partial and i == 1):
            n["power"] = copy.deepcopy(POWER)
        ns.append(n)
    return sim.parse_cluster({"num_nodes": nodes, "link_bw": 64, "link_latency": 1000, "nodes": ns})


def _workload(n, seed):
    import random
    rng = random.Random(seed)
    return parse_jsonl_lines(json.dumps({"input_toks": rng.randrange(10, 2000),
                                         "output_toks": rng.randrange(1, 100),
                                         "arrival_time_ns": rng.randrange(0, 5_000_000_000)})
                             for _ in range(n))


OPTS = sim.SimOptions(latency_provider="roofline", timeseries_interval_ns=250_000_000)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 30), seed=st.integers(0, 1000), tp=st.sampled_from([1, 2]),
       interval_ms=st.sampled_from([100, 1000]))
def test_energy_is_the_integral_of_power_and_components_add_up(n, seed, tp, interval_ms):
    opts = OPTS.replace(timeseries_interval_ns=interval_ms * 1_000_000)
    res = sim.simulate(_cluster(tp=tp), _workload(n, seed), opts)
    s = res.summary
    t = res.timeseries_table()
    integral = float((t["power_w"] * interval_ms / 1000).sum())
    assert integral == pytest.approx(s["energy_j"], rel=1e-3)
    assert sum(s["energy_by_component_j"].values()) == pytest.approx(s["energy_j"], rel=1e-9)
    for comp, joules in s["energy_by_component_j"].items():
        assert float((t[f"power_{comp}_w"] * interval_ms / 1000).sum()) == pytest.approx(
            joules, rel=1e-3, abs=1e-9)
    gen = int(res.requests_table().output_tokens.sum())
    assert s["energy_per_output_token_j"] == pytest.approx(s["energy_j"] / gen)


def test_busier_npu_uses_more_energy_than_idle_floor():
    res = sim.simulate(_cluster(), _workload(20, 1), OPTS)
    s = res.summary
    duration = s["simulated_s"]
    idle_floor = (60 + 70 + 10 + 0.15 * 190 + (128 / 32) * 2 + 5 + 20 + 10) * duration
    assert s["energy_j"] > idle_floor
    assert s["energy_by_component_j"]["npu"] < 700 * duration + 1e-6


def test_partial_power_blocks_are_refused():
    with pytest.raises(sim.InputError, match="no power block"):
        sim.simulate(_cluster(nodes=2, partial=True), _workload(3, 0), OPTS)
    bad = _cluster().raw
    bad = copy.deepcopy(bad)
    del bad["nodes"][0]["power"]["dram"]["energy_per_bit"]
    with pytest.raises(sim.InputError, match="energy_per_bit"):
        sim.simulate(sim.parse_cluster(bad), _workload(3, 0), OPTS)


def test_no_power_blocks_means_no_energy():
    res = sim.simulate(_cluster(power=False), _workload(5, 0), OPTS)
    assert res.summary["energy_j"] is None
    assert "power_w" not in res.timeseries_table().columns
