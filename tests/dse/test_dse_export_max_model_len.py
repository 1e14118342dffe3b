"""Exported servers start as vLLM 0.19 would start them: --max-model-len where the model's
default would not fit the KV cache, and configurations whose cache cannot hold the
workload's longest request are rejected before simulating."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import replace

import pandas as pd
from dse_testkit import write_space

import sim
from dse.config import make_trial_config, precheck, sim_inputs
from dse.export import deploy_script
from dse.report import export_best
from dse.space import load_space
from dse.study import Driver
from dse.worker import evaluate
from sim.request import Request

# one RTX 4090 per instance at gpu_memory_utilization 0.9: 2,588 blocks x 16 tokens (the
# count vLLM logged for the RTX 4090 validation run)
RTX = {"tp": 1, "replicas": 2, "max_num_seqs": 256, "max_num_batched_tokens": 2048}
RTX_BLOCKS = 2588
#: the longest request that fits alone: every block but vLLM's null block, plus the last
#: output token, whose KV is never written
RTX_LONGEST = (RTX_BLOCKS - 1) * 16 + 1


def _rtx_space(tmp_path, workload=None, **over):
    knobs = {"tp": [1, 2], "replicas": [1, 2], "max_num_seqs": [256],
             "max_num_batched_tokens": [2048]}
    data = {"hardware": "RTX4090", "knobs": knobs, **over}
    if workload is not None:
        data["workload"] = workload
    return load_space(write_space(tmp_path, **data))


def _serve_commands(script: str) -> list[list[str]]:
    return [shlex.split(line.split(" > ")[0]) for line in script.splitlines()
            if "vllm serve" in line]


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def _export(space, params, tmp_path, number=1):
    """serve.sh and bench.sh as `dse report` writes them (the front row through
    export_best)."""
    row = {"trial": number, **params, "throughput_per_device": 1.0, "p99_ttft": 2.0,
           "config": "c"}
    best = tmp_path / "best"
    export_best(space, pd.DataFrame([row]), best)
    return [(best / f"trial_{number:04d}.{kind}.sh").read_text() for kind in ("serve", "bench")]


def _bench_longest(bench: str) -> int:
    """The longest random request of a bench line, by vLLM 0.19's RandomDataset: prompts
    up to ceil(input_len x (1 + r)), outputs up to ceil(output_len x (1 + r))."""
    cmd = shlex.split(bench.splitlines()[-1])
    r = float(_flag(cmd, "--random-range-ratio"))
    return (math.ceil(int(_flag(cmd, "--random-input-len")) * (1 + r))
            + math.ceil(int(_flag(cmd, "--random-output-len")) * (1 + r)))


def test_rtx4090_serve_passes_the_generated_workloads_longest_request(tmp_path):
    space = _rtx_space(tmp_path)
    script, bench = _export(space, RTX, tmp_path)
    reqs = sim.generate(sim.workload_from_mapping(dict(space.workload["spec"]))).all_requests()
    longest = max(r.input_len + r.output_len for r in reqs)
    # uniform lengths: bench's one range ratio draws longer outputs than simulated
    assert _bench_longest(bench) > longest
    cmds = _serve_commands(script)
    assert len(cmds) == 2
    assert [_flag(c, "--max-model-len") for c in cmds] == [str(_bench_longest(bench))] * 2
    notes = [ln for ln in script.splitlines() if ln.startswith("# ")]
    assert any(ln.startswith(f"# --max-model-len {_bench_longest(bench)}: the longest request "
                             "(prompt + output) of the bench line's random ones (the "
                             f"workload's: {longest:,})") for ln in notes)
    assert any("131,072" in ln and f"8,192 KV blocks of 16, {RTX_BLOCKS:,} fit "
               f"({RTX_BLOCKS * 16:,} tokens)" in ln for ln in notes)


def test_rtx4090_serve_counts_the_replayed_requests_only(tmp_path):
    """A trace with a limit: L comes from the requests the trials replay, not the file."""
    lines = [{"input_toks": 900, "output_toks": 400, "arrival_time_ns": 0},
             {"input_toks": 1500, "output_toks": 2, "arrival_time_ns": 10**8},
             {"session_id": "s", "arrival_time_ns": 2 * 10**8,
              "sub_requests": [{"input_toks": 200, "output_toks": 20},
                               {"input_toks": 1700, "output_toks": 400}]},
             {"input_toks": 30000, "output_toks": 10, "arrival_time_ns": 3 * 10**8}]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    space = _rtx_space(tmp_path, workload={"file": str(trace), "limit": 3})
    script, bench = _export(space, RTX, tmp_path)
    # the session's second turn (1,700 + 400) is the longest of the first three entries,
    # and longer than the bench line's random requests
    assert _bench_longest(bench) < 2100
    assert {_flag(c, "--max-model-len") for c in _serve_commands(script)} == {"2100"}
    assert "# --max-model-len 2100: the workload's longest request (prompt + output), so " \
           "that vLLM starts and refuses or cuts no request." in script


def test_bench_requests_longer_than_fit_are_said_to_be_refused(tmp_path):
    """The workload fits (41,300 tokens at most) but the bench line's random requests can
    reach more than the 41,361 one request holds: L stays the workload's."""
    space = _rtx_space(tmp_path, workload={"generate": {
        "num_requests": 20, "rate": 5, "input": {"kind": "uniform", "low": 100, "high": 41000},
        "output": 300, "seed": 0}})
    script, bench = _export(space, RTX, tmp_path)
    reqs = sim.generate(sim.workload_from_mapping(dict(space.workload["spec"]))).all_requests()
    longest = max(r.input_len + r.output_len for r in reqs)
    assert longest <= 41361 < _bench_longest(bench)
    assert {_flag(c, "--max-model-len") for c in _serve_commands(script)} == {str(longest)}
    assert (f"the bench line's random requests reach {_bench_longest(bench):,} tokens, more "
            "than fit: the server refuses those over it.") in script


def test_rtx4090_with_the_flag_simulates_as_without_it(tmp_path):
    """The simulated run (at the model's 131,072) is what vLLM gives with the exported L."""
    space = _rtx_space(tmp_path, workload={"generate": {
        "num_requests": 12, "rate": 20, "input": {"kind": "uniform", "low": 64, "high": 900},
        "output": {"kind": "uniform", "low": 8, "high": 40}, "seed": 3}})
    cfg = make_trial_config(space, 1, RTX)
    length = _flag(_serve_commands(deploy_script(space, cfg, {"x": 1.0}))[0],
                   "--max-model-len")
    runs = [evaluate(space, {"number": 1, "cluster": cfg.cluster, "options": o})
            for o in (cfg.options, {**cfg.options, "max_model_len": int(length)})]
    assert runs[0].summary["rejected_requests"] == runs[1].summary["rejected_requests"] == 0
    assert runs[0].requests == runs[1].requests
    assert runs[0].summary["kv_cache"]["0"]["max_model_len"] == 131072
    assert runs[1].summary["kv_cache"]["0"]["max_model_len"] == int(length)


def test_h100_quickstart_serve_is_unchanged(tmp_path):
    """vLLM starts at the model's default on an H100: no flag, no note, the same bytes."""
    space = load_space("search_spaces/quickstart.yaml")
    params = {"tp": 2, "replicas": 4, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
              "enable_prefix_caching": True, "routing_policy": "RR"}
    cfg = make_trial_config(space, 5, params)
    caps = sim.kv_capacity(*sim_inputs(cfg))
    assert [c.max_model_len for c in caps] == [131072] * 4
    assert not any(c.start_refusal() for c in caps) and all(c.holds(131072) for c in caps)
    expected = (
        "#!/bin/sh\n"
        "# quickstart: trial 5, meta-llama/Llama-3.1-8B on 8 x H100-SXM (1 node(s), 4 "
        "vLLM server(s)).\n"
        "# Simulated: throughput_per_device 1, p99_ttft 2.\n"
        "# Set NODE<i>_HOST to each node's address when it spans several nodes.\n"
        "\n"
        "# ---- node 0: run these on ${NODE0_HOST:-localhost} ----\n"
        "# replica 0: GPUs 0-1\n"
        "CUDA_VISIBLE_DEVICES=0,1 vllm serve meta-llama/Llama-3.1-8B "
        "--tensor-parallel-size 2 --pipeline-parallel-size 1 --gpu-memory-utilization "
        "0.9 --max-num-seqs 256 --max-num-batched-tokens 8192 --block-size 16 "
        "--enable-prefix-caching --enable-chunked-prefill --port 8100 > server0.log 2>&1 "
        "&\n"
        "# replica 1: GPUs 2-3\n"
        "CUDA_VISIBLE_DEVICES=2,3 vllm serve meta-llama/Llama-3.1-8B "
        "--tensor-parallel-size 2 --pipeline-parallel-size 1 --gpu-memory-utilization "
        "0.9 --max-num-seqs 256 --max-num-batched-tokens 8192 --block-size 16 "
        "--enable-prefix-caching --enable-chunked-prefill --port 8101 > server1.log 2>&1 "
        "&\n"
        "# replica 2: GPUs 4-5\n"
        "CUDA_VISIBLE_DEVICES=4,5 vllm serve meta-llama/Llama-3.1-8B "
        "--tensor-parallel-size 2 --pipeline-parallel-size 1 --gpu-memory-utilization "
        "0.9 --max-num-seqs 256 --max-num-batched-tokens 8192 --block-size 16 "
        "--enable-prefix-caching --enable-chunked-prefill --port 8102 > server2.log 2>&1 "
        "&\n"
        "# replica 3: GPUs 6-7\n"
        "CUDA_VISIBLE_DEVICES=6,7 vllm serve meta-llama/Llama-3.1-8B "
        "--tensor-parallel-size 2 --pipeline-parallel-size 1 --gpu-memory-utilization "
        "0.9 --max-num-seqs 256 --max-num-batched-tokens 8192 --block-size 16 "
        "--enable-prefix-caching --enable-chunked-prefill --port 8103 > server3.log 2>&1 "
        "&\n"
        "\n"
        "# ---- a load balancer (round robin, the simulated routing policy RR) on port "
        "8000 in front of: ${NODE0_HOST:-localhost}:8100 ${NODE0_HOST:-localhost}:8101 "
        "${NODE0_HOST:-localhost}:8102 ${NODE0_HOST:-localhost}:8103 ----\n"
        "wait\n"
    )
    assert deploy_script(space, cfg, {"throughput_per_device": 1.0, "p99_ttft": 2.0}) == expected


def test_longest_sequence_follows_vllms_prompt_and_stop_rules():
    """vLLM 0.19 refuses a prompt of max_model_len tokens or more (no room for one output
    token) and stops a sequence when it reaches max_model_len."""
    w = sim.Workload([Request(0, 0, 1000, 1), Request(1, 10, 500, 300)])
    assert w.longest_sequence() == 1001  # not 1000: that prompt would be refused
    assert w.longest_sequence(1001) == 1001
    assert w.longest_sequence(1000) == 800  # the 1,000-token prompt is refused
    assert w.longest_sequence(700) == 700  # the other is cut there
    assert sim.Workload([Request(0, 0, 1000, 1)]).longest_sequence(1000) == 0


def test_the_exported_length_is_the_shortest_that_refuses_and_cuts_nothing(tmp_path):
    """Simulated at L (the rule's answer) nothing is refused or cut; at L - 1 the prompt
    at the boundary is refused."""
    space = _rtx_space(tmp_path)
    cluster, opts = sim_inputs(make_trial_config(space, 1, {**RTX, "replicas": 1}))

    def run(max_model_len):
        w = sim.Workload([Request(0, 0, 1000, 1), Request(1, 10**7, 500, 300)])
        res = sim.simulate(cluster, w, replace(opts, max_model_len=max_model_len))
        return res.summary["rejected_requests"], {r.rid: r.num_output for r in res.requests
                                                  if not r.rejected}

    length = sim.Workload([Request(0, 0, 1000, 1), Request(1, 10, 500, 300)]).longest_sequence()
    assert run(length) == (0, {0: 1, 1: 300})
    assert run(length - 1) == (1, {1: 300})


def _long_space(tmp_path, total):
    return _rtx_space(tmp_path, workload={"generate": {
        "num_requests": 2, "rate": 1, "input": 41000, "output": total - 41000}},
        search={"sampler": "grid", "n_trials": 4, "seed": 0})


def test_cache_too_small_for_the_longest_request_is_rejected_before_simulating(tmp_path):
    """2,588 blocks of 16, one of them vLLM's null block: a request reaching 41,393 tokens
    fits alone (its last output token's KV is never written), one of 41,394 never does."""
    cfg = make_trial_config(_long_space(tmp_path, RTX_LONGEST), 1, {**RTX, "replicas": 1})
    assert precheck(_long_space(tmp_path, RTX_LONGEST), cfg) is None
    fits = evaluate(_long_space(tmp_path, RTX_LONGEST),
                    {"number": 1, "cluster": cfg.cluster, "options": cfg.options})
    assert fits.rejected is None and fits.summary["rejected_requests"] == 0

    for total, vllm, export in (
            (RTX_LONGEST + 1, f"would start with --max-model-len {RTX_LONGEST + 1} but never "
             "schedule it", "never schedule that request"),
            (RTX_BLOCKS * 16 + 1, f"would refuse to start with --max-model-len "
             f"{RTX_BLOCKS * 16 + 1}", "refuse to start")):
        space = _long_space(tmp_path, total)
        why = precheck(space, cfg)
        assert why == (f"the KV cache cannot hold the workload's longest request even alone: "
                       f"{total:,} tokens (prompt + output) against at most {RTX_LONGEST:,} in instance "
                       f"0 ({RTX_BLOCKS:,} KV blocks of 16, one of them vLLM's null block); "
                       f"vLLM {vllm}")
        # what the simulation does with it: it stops at the request
        res = evaluate(space, {"number": 1, "cluster": cfg.cluster, "options": cfg.options})
        assert res.rejected and f"holds at most {RTX_LONGEST - 1}" in res.rejected
        script = deploy_script(space, cfg, {"x": 1.0})
        assert {_flag(c, "--max-model-len") for c in _serve_commands(script)} == {str(total)}
        assert f"Even so vLLM would {export}: this configuration cannot serve the workload's " \
               f"longest request (one request holds at most {RTX_LONGEST:,} tokens)." in script


def test_too_small_configurations_are_counted_as_rejected(tmp_path):
    """In a search: rejected before simulating with the reason, not counted as a trial;
    tp 2 holds the request and is simulated."""
    space = _long_space(tmp_path, 42000)
    summary = Driver(space, tmp_path / "out", workers=0, progress=False).run()
    df = pd.read_csv(tmp_path / "out" / "trials.csv")
    assert summary.complete == 2 and summary.rejected == 2  # tp 1 x replicas 1, 2
    rejected = df[df.rejected]
    assert sorted(rejected.tp) == [1, 1]
    assert all(r.startswith("the KV cache cannot hold the workload's longest request even "
                            "alone: 42,000 tokens") for r in rejected.reason)
    assert (df[~df.rejected].tp == 2).all()


def test_a_capacity_searchs_rates_draw_the_same_lengths():
    """L and the precheck read the space's workload at its own rate; a capacity search
    simulates it at other rates, which draw the same prompt and output lengths."""
    for extra in ({"arrival": "poisson"}, {"arrival": "gamma", "cv": 2.5}):
        spec = {"num_requests": 50, "input": {"kind": "uniform", "low": 10, "high": 4000},
                "output": {"kind": "zipf", "low": 1, "high": 900}, "seed": 4, **extra}
        lengths = [[(r.input_len, r.output_len) for r in sim.generate(
            sim.workload_from_mapping({**spec, "rate": rate})).all_requests()]
            for rate in (0.5, 10, 300)]
        assert lengths[0] == lengths[1] == lengths[2]
