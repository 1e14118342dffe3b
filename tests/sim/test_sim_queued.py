"""vLLM's QUEUED event: the engine core reads new requests from its input queue only
between steps (or at once while it is idle), and its per-request timestamps (queued_ts,
first_token_ts, last_token_ts) count from that read, not from the client's arrival."""

from __future__ import annotations

import json

import sim
from sim.scheduler import Scheduler
from sim.workload import parse_jsonl_lines

MOE = "Qwen/Qwen3-30B-A3B-Instruct-2507"


def _cluster(dp_group):
    inst = {"model_name": MOE, "hardware": "H100-SXM",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
            "num_npus": 1, "tp_size": 1, "ep_size": 2 if dp_group else 1, "dp_group": dp_group}
    n = 2 if dp_group else 1
    return sim.parse_cluster({"num_nodes": 1, "link_bw": 64, "link_latency": 1000, "nodes": [{
        "num_instances": n, "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 0},
        "instances": [inst] * n}]})


def _run(dp_group, async_scheduling, monkeypatch):
    ends: list[int] = []
    original = Scheduler.complete

    def recording(self, batch, now, itl):
        ends.append(now)
        return original(self, batch, now, itl)

    monkeypatch.setattr(Scheduler, "complete", recording)
    # request 0 finds the engine idle; the others arrive while its steps run
    wl = parse_jsonl_lines(json.dumps({"input_toks": 1500, "output_toks": 40,
                                       "arrival_time_ns": i * 7_300_000}) for i in range(6))
    opts = sim.SimOptions(latency_provider="roofline", async_scheduling=async_scheduling)
    return sim.simulate(_cluster(dp_group), wl, opts), set(ends)


def test_requests_are_queued_when_the_engine_reads_its_input(monkeypatch):
    for dp_group in (None, "A"):
        for async_scheduling in (False, True):
            res, ends = _run(dp_group, async_scheduling, monkeypatch)
            reqs = sorted(res.requests, key=lambda r: r.rid)
            first = reqs[0]
            assert first.queued_ns == first.arrival_ns == 0
            late = [r for r in reqs[1:] if r.queued_ns > r.arrival_ns]
            assert late, "requests arriving mid-step wait for the step to end"
            for r in reqs:
                assert r.arrival_ns <= r.queued_ns <= r.first_scheduled_ns
                # read at a step boundary, or on arrival at an idle engine
                assert r.queued_ns == r.arrival_ns or r.queued_ns in ends
            s = res.summary
            assert s["engine_ttft_ms"]["mean"] < s["ttft_ms"]["mean"]
            assert s["engine_latency_ms"]["mean"] < s["latency_ms"]["mean"]
            wait = sum(r.queued_ns - r.arrival_ns for r in reqs) / len(reqs) / 1e6
            assert abs(s["ttft_ms"]["mean"] - s["engine_ttft_ms"]["mean"] - wait) < 1e-6


def test_real_dp2_ep2_run_low_load_ttft_counts_from_queued_ts():
    # vLLM's requests.jsonl gives TTFT as first_token_ts - queued_ts; at low load the median
    # request waits ~half a step for the engine to read it, which the real figure leaves
    # out. Counted from arrival the simulated p50 was +27.7%; from QUEUED it is within 10%.
    import pytest

    from experiments.validate_vllm import measured_stats, simulate_validation
    from sim.paths import shared_data_root

    folder = shared_data_root() / "validation" / "RTXPRO6000-Qwen3-30B-A3B-DP2-EP2"
    if not (folder / "vllm" / "requests.jsonl").is_file():
        pytest.skip(f"shared validation data not available: {folder}")
    real = measured_stats(folder / "vllm" / "requests.jsonl")
    simulated, _ = simulate_validation(folder)
    # (+3.8% with the MoE exchange on sim.topology's reading of the cluster file's link:
    # one 20 us message per collective step, 16 x 2^30 B/s; README, the MoE case)
    assert simulated["ttft"]["p50"] == pytest.approx(real["ttft"]["p50"], rel=0.06)
