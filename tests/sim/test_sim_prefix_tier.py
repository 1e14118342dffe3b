"""Hierarchical prefix caching: a lower-tier (CPU/CXL) hit sits between an NPU hit and a
recompute in cost, and sharing lets one instance reuse another's evicted prefixes."""

from __future__ import annotations

import json
import random

import pytest

import sim
from sim.workload import parse_jsonl_lines
from sim_testkit import util_with_overhead


def _cluster(instances: int = 1, mem_util: float = 0.2, cxl: bool = False) -> sim.ClusterConfig:
    inst = {"model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0, "mem_util": util_with_overhead(mem_util, 80, hardware="H100-SXM")},
            "num_npus": 1, "tp_size": 1}
    c = {"num_nodes": 1, "link_bw": 450, "link_latency": 500, "nodes": [{
        "num_instances": instances, "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 1000},
        "instances": [dict(inst) for _ in range(instances)]}]}
    if cxl:
        c["cxl_mem"] = {"mem_size": 512, "mem_bw": 16, "mem_latency": 5000, "num_devices": 1}
    return sim.parse_cluster(c)


def _prefix_workload(num_prefixes: int, repeats: int, gap_ns: int = 400_000_000):
    rng = random.Random(0)
    prefixes = [[rng.randrange(100_000) for _ in range(4096)] for _ in range(num_prefixes)]
    lines = []
    for i in range(num_prefixes * repeats):
        ids = prefixes[i % num_prefixes] + [rng.randrange(100_000) for _ in range(32)]
        lines.append(json.dumps({"input_toks": len(ids), "output_toks": 4,
                                 "arrival_time_ns": i * gap_ns, "input_tok_ids": ids}))
    return parse_jsonl_lines(lines)


def _ttft_by_kind(result):
    t = result.requests_table()
    lower = t.prefix_hit_tokens_lower_tier > 0
    npu = (t.prefix_hit_tokens - t.prefix_hit_tokens_lower_tier) > 0
    return (t[npu & ~lower].ttft_ns.mean(), t[lower].ttft_ns.mean(),
            t[~npu & ~lower].ttft_ns.mean())


def test_lower_tier_hit_is_cheaper_than_recompute_and_dearer_than_npu_hit():
    # 8 prefixes of 4096 tokens cycle through a KV cache too small to keep them all, so
    # the NPU's LRU cache misses and only the CPU tier can serve them.
    wl = _prefix_workload(num_prefixes=8, repeats=3)
    cluster = _cluster(mem_util=0.21)
    tiered = sim.simulate(cluster, wl, sim.SimOptions(latency_provider="roofline",
                                                      prefix_storage="CPU"))
    npu_only = sim.simulate(cluster, wl, sim.SimOptions(latency_provider="roofline"))
    assert tiered.summary["prefix_hit_tokens_lower_tier"] > 0
    assert npu_only.summary["prefix_hit_tokens_lower_tier"] == 0
    _, lower_ttft, miss_ttft = _ttft_by_kind(tiered)
    # NPU hits: few prefixes that fit on the NPU.
    hot = sim.simulate(cluster, _prefix_workload(num_prefixes=2, repeats=4),
                       sim.SimOptions(latency_provider="roofline", prefix_storage="CPU"))
    npu_ttft, _, _ = _ttft_by_kind(hot)
    assert npu_ttft < lower_ttft < miss_ttft
    assert tiered.summary["ttft_ms"]["mean"] < npu_only.summary["ttft_ms"]["mean"]
    assert tiered.summary["prefix_hit_ratio_lower_tier"] > 0.3


def test_cxl_tier_is_slower_than_cpu_tier_and_needs_cxl_config():
    wl = _prefix_workload(num_prefixes=8, repeats=3)
    cpu = sim.simulate(_cluster(mem_util=0.21, cxl=True), wl,
                       sim.SimOptions(latency_provider="roofline", prefix_storage="CPU"))
    cxl = sim.simulate(_cluster(mem_util=0.21, cxl=True), wl,
                       sim.SimOptions(latency_provider="roofline", prefix_storage="CXL"))
    assert cxl.summary["prefix_hit_tokens_lower_tier"] == cpu.summary["prefix_hit_tokens_lower_tier"]
    assert _ttft_by_kind(cxl)[1] > _ttft_by_kind(cpu)[1]
    with pytest.raises(sim.InputError, match="cxl_mem"):
        sim.simulate(_cluster(), wl, sim.SimOptions(latency_provider="roofline",
                                                    prefix_storage="CXL"))


def test_prefix_sharing_serves_one_instance_from_another_instances_evictions():
    # Round-robin over two instances with an odd number of prefixes: each prefix alternates
    # instances, so without sharing an instance only sees its own evictions.
    wl = _prefix_workload(num_prefixes=7, repeats=4)
    cluster = _cluster(instances=2, mem_util=0.195)  # each NPU holds about one prefix
    private = sim.simulate(cluster, wl, sim.SimOptions(
        latency_provider="roofline", prefix_storage="CPU", routing_policy="RR"))
    shared = sim.simulate(cluster, wl, sim.SimOptions(
        latency_provider="roofline", prefix_storage="CPU", enable_prefix_sharing=True,
        routing_policy="RR"))
    assert (shared.summary["prefix_hit_tokens_lower_tier"]
            > private.summary["prefix_hit_tokens_lower_tier"])
    with pytest.raises(sim.InputError, match="prefix_storage"):
        sim.SimOptions(enable_prefix_sharing=True).validate()
