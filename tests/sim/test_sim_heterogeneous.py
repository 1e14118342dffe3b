"""Heterogeneous clusters: instances on different hardware, each with its own latency
provider, and LLMServingSim's per-instance scheduler overrides."""

from __future__ import annotations

import pytest

import sim
from sim.paths import shared_data_root


def _inst(hw, mem, bw, **kw):
    return {"model_name": "meta-llama/Llama-3.1-8B", "hardware": hw,
            "npu_mem": {"mem_size": mem, "mem_bw": bw, "mem_latency": 0}, "tp_size": 1, **kw}


def test_prefill_on_h100_decode_on_l40s_each_with_its_own_provider():
    cluster = sim.parse_cluster({"num_nodes": 1, "link_bw": 32, "link_latency": 2000, "nodes": [{
        "num_instances": 2, "instances": [_inst("H100-SXM", 80, 3350, pd_type="prefill"),
                                          _inst("L40S", 48, 864, pd_type="decode")]}]})
    wl = sim.generate(sim.WorkloadSpec(num_requests=20, rate=4.0, seed=1))
    res = sim.simulate(cluster, wl, sim.SimOptions(latency_provider="roofline"))
    src = res.summary["latency_source"]
    assert src == {"0": "roofline(H100-SXM)", "1": "roofline(L40S)"}
    assert res.summary["num_finished"] == 20 and res.summary["kv_transfers"] == 20


def test_colocated_instances_on_different_hardware_differ_in_speed():
    cluster = sim.parse_cluster({"num_nodes": 1, "link_bw": 32, "link_latency": 2000, "nodes": [{
        "num_instances": 2, "instances": [_inst("H100-SXM", 80, 3350), _inst("L40S", 48, 864)]}]})
    wl = sim.generate(sim.WorkloadSpec(num_requests=40, rate=20.0, seed=2))
    t = sim.simulate(cluster, wl, sim.SimOptions(latency_provider="roofline",
                                                 routing_policy="RR")).requests_table()
    by = t.groupby("instance_id").tpot_ns.mean()
    assert by[0] < by[1]  # H100 decodes faster than L40S


def test_measured_and_roofline_providers_mix_in_one_cluster():
    if not (shared_data_root() / "profiles" / "RTX4090").is_dir():
        pytest.skip("../shared/data profiles are not present")
    cluster = sim.parse_cluster({"num_nodes": 1, "link_bw": 32, "link_latency": 2000, "nodes": [{
        "num_instances": 2, "instances": [_inst("RTX4090", 24, 1008), _inst("H100-SXM", 80, 3350)]}]})
    res = sim.simulate(cluster, sim.generate(sim.WorkloadSpec(num_requests=10, seed=3)),
                       sim.SimOptions())
    # auto: the bundle for the 4090; aiconfigurator's H100 database when installed, else
    # the roofline (#17: measured > aic > roofline)
    import importlib.util
    h100 = "aic" if importlib.util.find_spec("aiconfigurator_core") else "roofline"
    assert res.summary["latency_provider"] == "mixed:" + ",".join(sorted(["measured", h100]))


def test_zero_token_budget_on_an_instance_means_unlimited():
    cluster = sim.parse_cluster({"num_nodes": 1, "link_bw": 32, "link_latency": 2000, "nodes": [{
        "num_instances": 2, "instances": [
            _inst("H100-SXM", 80, 3350, pd_type="prefill"),
            _inst("H100-SXM", 80, 3350, pd_type="decode", max_num_batched_tokens=0,
                  enable_chunked_prefill=False)]}]})
    res = sim.simulate(cluster, sim.generate(sim.WorkloadSpec(num_requests=8, seed=4)),
                       sim.SimOptions(latency_provider="roofline"))
    assert res.summary["num_finished"] == 8
