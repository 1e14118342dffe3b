"""Agentic sessions, and conservation across random configurations with the advanced
features (PD, lower prefix tier, DP/EP) switched on."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim.workload import parse_jsonl_lines
from sim_testkit import util_with_overhead


def _cluster(n=1, pd=False, model="meta-llama/Llama-3.1-8B", ep=1, dp=False, mem_util=0.9):
    insts = []
    for i in range(n):
        inst = {"model_name": model, "hardware": "H100-SXM",
                "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0, "mem_util": mem_util},
                "num_npus": 1, "tp_size": 1}
        if pd:
            inst["pd_type"] = "prefill" if i < max(1, n // 2) else "decode"
        if ep > 1:
            inst["ep_size"] = ep
        if dp:
            inst["dp_group"] = "A"
        insts.append(inst)
    return sim.parse_cluster({"num_nodes": 1, "link_bw": 64, "link_latency": 1000, "nodes": [{
        "num_instances": n, "cpu_mem": {"mem_size": 64, "mem_bw": 50, "mem_latency": 0},
        "instances": insts}]})


def _session_lines(num_sessions=4, turns=3, seed=0, with_ids=True):
    rng = random.Random(seed)
    lines = []
    for s in range(num_sessions):
        history: list[int] = []
        subs = []
        for t in range(turns):
            new = [rng.randrange(50_000) for _ in range(rng.randrange(100, 400))]
            prompt = history + new
            out = [rng.randrange(50_000) for _ in range(rng.randrange(8, 40))]
            sub = {"input_toks": len(prompt), "output_toks": len(out),
                   "tool_duration_ns": rng.randrange(1, 5) * 100_000_000}
            if with_ids:
                sub["input_tok_ids"] = prompt
                sub["output_tok_ids"] = out
            subs.append(sub)
            history = prompt + out
        lines.append(json.dumps({"session_id": f"s{s}", "arrival_time_ns": s * 50_000_000,
                                 "sub_requests": subs}))
    return lines


OPTS = sim.SimOptions(latency_provider="roofline")


def test_turn_arrives_after_previous_turn_ends_plus_tool_time():
    lines = _session_lines()
    wl = parse_jsonl_lines(lines)
    res = sim.simulate(_cluster(), wl, OPTS)
    t = res.requests_table().sort_values(["session_id", "sub_request_index"])
    tools = {(json.loads(line)["session_id"], k): sub["tool_duration_ns"]
             for line in lines for k, sub in enumerate(json.loads(line)["sub_requests"])}
    for sid, g in t.groupby("session_id"):
        rows = g.to_dict("records")
        assert [r["sub_request_index"] for r in rows] == list(range(len(rows)))
        for prev, cur in itertools.pairwise(rows):
            assert cur["arrival_ns"] == prev["last_token_ns"] + tools[(sid, cur["sub_request_index"])]
    assert res.summary["num_sessions"] == 4
    assert res.summary["session_e2e_ms"]["mean"] > 0


def test_later_turns_reuse_the_earlier_turns_prefix():
    res = sim.simulate(_cluster(), parse_jsonl_lines(_session_lines()), OPTS)
    t = res.requests_table()
    later = t[t.sub_request_index > 0]
    assert (later.prefix_hit_tokens > 0).all()
    assert (t[t.sub_request_index == 0].prefix_hit_tokens == 0).all()
    no_ids = sim.simulate(_cluster(), parse_jsonl_lines(_session_lines(with_ids=False)), OPTS)
    assert no_ids.summary["prefix_hit_tokens"] == 0
    assert res.summary["ttft_ms"]["mean"] < no_ids.summary["ttft_ms"]["mean"]


def test_loop_waits_for_deferred_turns():
    # One session whose last turn starts long after everything else has finished.
    line = json.dumps({"session_id": "late", "arrival_time_ns": 0, "sub_requests": [
        {"input_toks": 50, "output_toks": 4},
        {"input_toks": 60, "output_toks": 4, "tool_duration_ns": 30_000_000_000}]})
    res = sim.simulate(_cluster(), parse_jsonl_lines([line]), OPTS)
    assert res.summary["num_finished"] == 2
    assert res.summary["simulated_s"] > 30


def test_session_without_sub_requests_is_an_input_error():
    with pytest.raises(sim.InputError, match="sub_requests"):
        parse_jsonl_lines([json.dumps({"session_id": "x", "arrival_time_ns": 0,
                                       "sub_requests": []})], source="w.jsonl")


FEATURES = st.sampled_from(["plain", "pd", "tier", "dp_ep", "sessions"])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(feature=FEATURES, seed=st.integers(0, 10_000), n=st.integers(3, 25),
       max_seqs=st.sampled_from([4, 32, 256]), budget=st.sampled_from([256, 2048]),
       chunked=st.booleans())
def test_conservation_with_advanced_features(feature, seed, n, max_seqs, budget, chunked):
    rng = random.Random(seed)
    opts = OPTS.replace(max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                        enable_chunked_prefill=chunked, seed=seed)
    if not chunked:
        budget_ok = budget
    else:
        budget_ok = 10_000
    if feature == "sessions":
        wl = parse_jsonl_lines(_session_lines(num_sessions=max(1, n // 3), seed=seed))
        if not chunked:
            opts = opts.replace(max_num_batched_tokens=8192)
        cluster = _cluster()
    else:
        lines = [json.dumps({"input_toks": rng.randrange(1, min(budget_ok, 3000)),
                             "output_toks": rng.randrange(1, 60),
                             "arrival_time_ns": rng.randrange(0, 2_000_000_000)}) for _ in range(n)]
        wl = parse_jsonl_lines(lines)
        if feature == "pd":
            cluster = _cluster(n=3, pd=True)
        elif feature == "tier":
            # a small KV pool (0.2 of the memory beyond vLLM's overheads) so blocks are evicted
            cluster = _cluster(n=2, mem_util=util_with_overhead(0.2, 80, hardware="H100-SXM"))
            opts = opts.replace(prefix_storage="CPU", enable_prefix_sharing=True)
        elif feature == "dp_ep":
            cluster = _cluster(n=2, model="Qwen/Qwen3-30B-A3B-Instruct-2507", ep=2, dp=True)
        else:
            cluster = _cluster(n=2)
    res = sim.simulate(cluster, wl, opts)
    t = res.requests_table()
    expected = sorted(wl.all_requests(), key=lambda r: r.rid)
    # no request lost or duplicated, every one finished
    assert sorted(t.request_id) == [r.rid for r in expected]
    assert res.summary["num_finished"] == len(expected)
    # tokens conserved
    assert list(t.sort_values("request_id").output_tokens) == [r.output_len for r in expected]
    assert list(t.sort_values("request_id").input_tokens) == [r.input_len for r in expected]
    assert (t.first_token_ns >= t.arrival_ns).all() and (t.last_token_ns >= t.first_token_ns).all()
    # every request is prefilled on a prefill instance and hands its KV over to a decode
    # instance, which produces the client's tokens (vLLM's disaggregated proxy sends every
    # request to both, a one-token output included): one KV transfer each
    if feature == "pd":
        assert res.summary["kv_transfers"] == len(expected)
    else:
        assert res.summary["kv_transfers"] == 0
