"""``llmsim bench`` (vllm bench serve's interface) and ``llmsim compare`` (#17)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

import sim
from sim.bench import bench_workload
from sim.cli import main
from sim.compare import compare, load_result, metrics_from_requests
from sim.paths import shared_data_root

VALID = shared_data_root() / "validation" / "RTX4090-Llama-3.1-8B"
WORKLOAD = shared_data_root() / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl"
#: keys vLLM's `bench serve --save-result` writes that a comparison reads
VLLM_KEYS = {"date", "backend", "model_id", "num_prompts", "request_rate", "burstiness",
             "max_concurrency", "duration", "completed", "total_input_tokens",
             "total_output_tokens", "request_throughput", "output_throughput",
             "total_token_throughput", "input_lens", "output_lens", "ttfts",
             "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
             "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
             "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p99_itl_ms",
             "mean_e2el_ms", "median_e2el_ms", "std_e2el_ms", "p99_e2el_ms"}


@pytest.mark.skipif(not (VALID.is_dir() and WORKLOAD.is_file()), reason="no validation data")
def test_bench_reproduces_llmsim_run_on_the_4090_validation(tmp_path, capsys):
    """Same workload, same engine settings: the same numbers, to the nanosecond."""
    n = "120"
    assert main(["run", "--cluster", str(VALID / "cluster.json"), "--dataset", str(WORKLOAD),
                 "--num-reqs", n, "--output", str(tmp_path / "run.csv"),
                 "--latency-provider", "measured"]) == 0
    run = json.loads((tmp_path / "run.summary.json").read_text())
    out = tmp_path / "bench.json"
    mem_util = json.loads((VALID / "cluster.json").read_text())["nodes"][0]["instances"][0][
        "npu_mem"]["mem_util"]
    assert main(["bench", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "RTX4090",
                 "--dataset-name", "custom", "--dataset-path", str(WORKLOAD),
                 "--use-trace-timestamps", "--num-prompts", n,
                 "--gpu-memory-utilization", str(mem_util), "--latency-provider", "measured",
                 "--save-result", "--result-filename", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "============ Serving Benchmark Result ============" in printed
    assert "Mean TTFT (ms):" in printed and "P99 TPOT (ms):" in printed
    res = json.loads(out.read_text())
    assert VLLM_KEYS <= set(res)
    assert res["completed"] == run["num_finished"] == int(n)
    assert res["simulator"]["kv_blocks"] == run["kv_blocks"]
    for ours, theirs in (("mean_ttft_ms", ("ttft_ms", "mean")), ("p99_ttft_ms", ("ttft_ms", "p99")),
                         ("mean_tpot_ms", ("tpot_ms", "mean")), ("p99_tpot_ms", ("tpot_ms", "p99")),
                         ("mean_itl_ms", ("itl_ms", "mean")),
                         ("mean_e2el_ms", ("latency_ms", "mean"))):
        assert res[ours] == pytest.approx(run[theirs[0]][theirs[1]], rel=1e-12), ours


def _args(**kw):
    base = dict(num_prompts=40, request_rate="inf", max_concurrency=None, seed=0,
                dataset_name="random", dataset_path=None, random_input_len=1000,
                random_output_len=100, random_range_ratio=0.0, burstiness=1.0,
                use_trace_timestamps=False)
    return SimpleNamespace(**{**base, **kw})


def test_random_dataset_lengths_and_arrivals():
    w = bench_workload(_args(random_range_ratio=0.5, seed=3))
    ins = [r.input_len for r in w.requests]
    assert min(ins) >= 500 and max(ins) <= 1500 and len(set(ins)) > 10
    assert [r.input_len for r in bench_workload(_args(random_range_ratio=0.5, seed=3)).requests] \
        == ins
    assert all(r.arrival_ns == 0 for r in w.requests) and w.closed_loop_clients == 0
    w = bench_workload(_args(request_rate="4"))
    gaps = [b.arrival_ns - a.arrival_ns for a, b in zip(w.requests, w.requests[1:])]
    assert all(g >= 0 for g in gaps) and 0.1 < sum(gaps) / len(gaps) / 1e9 < 0.5
    assert bench_workload(_args(max_concurrency=4)).closed_loop_clients == 4


def test_max_concurrency_caps_requests_in_flight():
    """vLLM's client holds at most --max-concurrency requests in flight: a closed loop."""
    cluster = sim.parse_cluster({"num_nodes": 1, "link_bw": 450, "link_latency": 500, "nodes": [{
        "num_instances": 1, "instances": [{
            "model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM", "num_npus": 1,
            "tp_size": 1, "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0}}]}]})
    w = bench_workload(_args(max_concurrency=4, num_prompts=24, random_output_len=20))
    res = sim.simulate(cluster, w, sim.SimOptions(latency_provider="roofline"))
    events = sorted([(r.arrival_ns, 1) for r in res.requests] +
                    [(r.finish_ns, -1) for r in res.requests])
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak == 4 and res.summary["num_finished"] == 24


def test_rate_with_max_concurrency_paces_and_caps():
    """A finite --request-rate with --max-concurrency: each request goes out at its Poisson
    time or when one of the slots frees, whichever is later (vLLM's semaphore), so at most N
    are in flight and none leaves before its own time."""
    cluster = sim.parse_cluster({"num_nodes": 1, "link_bw": 450, "link_latency": 500, "nodes": [{
        "num_instances": 1, "instances": [{
            "model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM", "num_npus": 1,
            "tp_size": 1, "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0}}]}]})
    args = _args(max_concurrency=2, num_prompts=30, random_output_len=200, request_rate="50")
    poisson = [r.arrival_ns for r in bench_workload(_args(num_prompts=30, random_output_len=200,
                                                          request_rate="50")).requests]
    w = bench_workload(args)
    assert w.paced and w.closed_loop_clients == 2
    res = sim.simulate(cluster, w, sim.SimOptions(latency_provider="roofline"))
    by_id = sorted(res.requests, key=lambda r: r.rid)
    sent = [r.arrival_ns for r in by_id]
    assert all(s >= p for s, p in zip(sent, poisson))
    assert any(s > p for s, p in zip(sent, poisson))  # 50 req/s outruns 2 slots of 200 tokens
    assert sent[:2] == poisson[:2]
    events = sorted([(r.arrival_ns, 1) for r in by_id] + [(r.finish_ns, -1) for r in by_id])
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak <= 2 and res.summary["num_finished"] == 30


def test_bench_bad_input_exits_2(capsys):
    base = ["bench", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "H100-SXM",
            "--num-prompts", "4", "--latency-provider", "roofline"]
    for extra, needle in ((["--request-rate", "fast"], "--request-rate"),
                          (["--request-rate", "2", "--max-concurrency", "0"], "--max-concurrency"),
                          (["--dataset-name", "sharegpt"], "--dataset-path"),
                          (["--hardware", "NoGPU"], "NoGPU"),
                          (["--latency-provider", "magic"], "magic"),
                          (["--quantization", "awq"], "awq"),
                          (["--random-range-ratio", "1.5"], "--random-range-ratio")):
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0] and "Traceback" not in err[0], (extra, err)


@pytest.mark.skipif(not VALID.is_dir(), reason="no validation data")
def test_compare_reads_per_request_jsonl_like_validate_vllm(tmp_path, capsys):
    from experiments.validate_vllm import measured_stats

    jsonl = VALID / "vllm" / "requests.jsonl"
    ours = load_result(jsonl)
    theirs = measured_stats(jsonl)
    assert ours["mean_ttft_ms"] == pytest.approx(theirs["ttft"]["mean"])
    assert ours["p99_tpot_ms"] == pytest.approx(theirs["tpot"]["p99"])
    sim_json = tmp_path / "s.json"
    sim_json.write_text(json.dumps({**ours, "mean_ttft_ms": ours["mean_ttft_ms"] * 1.1}))
    rows = {k: e for k, _, _, e in compare(load_result(sim_json), ours)}
    assert rows["mean_ttft_ms"] == pytest.approx(10.0) and rows["mean_tpot_ms"] == 0
    assert main(["compare", str(sim_json), str(jsonl)]) == 0
    assert "mean_ttft_ms" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    assert main(["compare", str(bad), str(jsonl)]) == 2


def test_validate_vllm_leaves_single_token_outputs_out_of_tpot(tmp_path):
    """TPOT is undefined for a one-token output: vLLM's benchmark, ``llmsim compare`` and
    the simulator's summary leave such requests out; validate_vllm counted them as 0."""
    from experiments.validate_vllm import measured_stats

    rows = [{"input_toks": 10, "output_toks": n, "queued_ts": 0.0, "first_token_ts": 0.1,
             "last_token_ts": 0.1 + 0.02 * (n - 1)} for n in (1, 5, 9, 1)]
    jsonl = tmp_path / "requests.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = measured_stats(jsonl)
    assert stats["tpot"]["mean"] == pytest.approx(20.0)
    assert stats["tpot"]["mean"] == pytest.approx(load_result(jsonl)["mean_tpot_ms"])
    assert stats["ttft"]["mean"] == pytest.approx(100.0)  # every request keeps its TTFT


def test_metrics_from_requests_rejects_missing_fields():
    from sim.errors import InputError
    with pytest.raises(InputError, match="first_token_ts"):
        metrics_from_requests([{"input_toks": 1, "output_toks": 2, "queued_ts": 0.0}], "x")
    assert math.isfinite(metrics_from_requests([{"input_toks": 1, "output_toks": 3,
                                                 "queued_ts": 0.0, "first_token_ts": 0.1,
                                                 "last_token_ts": 0.3}], "x")["mean_tpot_ms"])


# vLLM 0.19's `vllm serve` picks max_num_seqs / max_num_batched_tokens by device
# (EngineArgs.get_batch_defaults, OpenAI-API-server context): 1024 / 8192 on a device with at
# least 70 GiB of total memory that is not an A100, else 256 / 2048. Before, `llmsim bench`
# ran 256 / 2048 everywhere, so an H100 benchmark without the flags was not the server's.
@pytest.mark.parametrize("hardware,expected", [
    ("H100-SXM", (1024, 8192)), ("H200-SXM", (1024, 8192)), ("B200", (1024, 8192)),
    ("RTXPRO6000", (1024, 8192)),        # 94.97 GiB reported
    ("A100-80G-SXM", (256, 2048)),       # the A100 carve-out (vLLM PR #17885)
    ("L40S", (256, 2048)), ("RTX4090", (256, 2048)),
])
def test_bench_defaults_follow_vllm_serve_per_device(hardware, expected):
    from sim.bench import resolve_serve_defaults

    args = SimpleNamespace(hardware=hardware, max_num_seqs=None, max_num_batched_tokens=None)
    resolve_serve_defaults(args)
    assert (args.max_num_seqs, args.max_num_batched_tokens) == expected
    given = SimpleNamespace(hardware=hardware, max_num_seqs=64, max_num_batched_tokens=None)
    resolve_serve_defaults(given)
    assert (given.max_num_seqs, given.max_num_batched_tokens) == (64, expected[1])


def test_bench_on_h100_without_the_flags_runs_vllm_serve_s_defaults(tmp_path):
    out = tmp_path / "r.json"
    assert main(["bench", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "H100-SXM",
                 "--num-prompts", "300", "--random-input-len", "64", "--random-output-len",
                 "8", "--latency-provider", "roofline", "--save-result",
                 "--result-filename", str(out)]) == 0
    res = json.loads(out.read_text())
    # 300 requests at an infinite rate: all admitted in the first step (1024 sequences,
    # 8192 tokens: 128 prompts of 64 tokens a step), where 256 / 2048 took 32 a step
    first = sorted(res["ttfts"])
    assert first[127] == pytest.approx(first[0], rel=0.01)
