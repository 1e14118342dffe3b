"""Prefill/decode disaggregation: routing, KV transfer cost, decode-side admission."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sim
from sim.workload import parse_jsonl_lines
from sim_testkit import util_with_overhead


def _pd_cluster(link_bw: float = 16, prefill: int = 1, decode: int = 1, tp: int = 1,
                mem_util: float = 0.9) -> sim.ClusterConfig:
    def inst(role):
        return {"model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
                "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0, "mem_util": util_with_overhead(mem_util, 80, hardware="H100-SXM")},
                "num_npus": tp, "tp_size": tp, "pd_type": role}
    return sim.parse_cluster({"num_nodes": 1, "link_bw": link_bw, "link_latency": 2000, "nodes": [{
        "num_instances": prefill + decode,
        "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 0},
        "instances": [inst("prefill") for _ in range(prefill)] + [inst("decode") for _ in range(decode)]}]})


def _workload(lengths, output=8, gap_ns=200_000_000):
    return parse_jsonl_lines(json.dumps({"input_toks": n, "output_toks": output,
                                         "arrival_time_ns": i * gap_ns})
                             for i, n in enumerate(lengths))


OPTS = sim.SimOptions(latency_provider="roofline")


def test_requests_prefill_on_prefill_instances_and_decode_on_decode_instances():
    res = sim.simulate(_pd_cluster(prefill=2, decode=1), _workload([500] * 12, gap_ns=1_000_000),
                       OPTS)
    t = res.requests_table()
    assert set(t.prefill_instance_id) == {0, 1}
    assert set(t.instance_id) == {2}
    assert res.summary["kv_transfers"] == 12
    # As with vLLM's disaggregated serving, the client's first token comes from the decode
    # instance: TTFT covers the prefill, the KV transfer and the first decode step.
    assert ((t.first_token_ns - t.arrival_ns) == t.ttft_ns).all()
    assert (t.ttft_ns > t.kv_transfer_ns).all()
    assert (t.output_tokens == 8).all()


def test_transfer_time_scales_with_context_length_and_link_bandwidth():
    def transfer_ms(n, bw):
        res = sim.simulate(_pd_cluster(link_bw=bw), _workload([n] * 4, gap_ns=2_000_000_000), OPTS)
        return res.requests_table().kv_transfer_ns.mean() / 1e6

    short, long = transfer_ms(1000, 16), transfer_ms(4000, 16)
    assert long == pytest.approx(4 * short, rel=0.02)
    slow, fast = transfer_ms(2000, 16), transfer_ms(2000, 64)
    assert slow == pytest.approx(4 * fast, rel=0.05)
    # Closed form: one message of the file's link_latency (the GPU-to-GPU path, as
    # LLMServingSim gives it to ASTRA-Sim) + KV bytes of the context over the link
    # (link_bw in ASTRA-Sim's GB/s of 2^30 B/s).
    model = sim.engine.load_model("meta-llama/Llama-3.1-8B")
    expected_ms = (2000 + 2000 * model.kv_bytes_per_token() / (16 * (1 << 30) / 1e9)) / 1e6
    assert slow == pytest.approx(expected_ms, rel=0.01)


def test_slower_link_raises_ttft_by_the_transfer_time():
    # The transfer sits between the prefill and the decode side's first token (vLLM's
    # proxy streams the decode instance's tokens), not in the first inter-token gap.
    wl = _workload([3000] * 6, output=16, gap_ns=1_000_000_000)
    fast = sim.simulate(_pd_cluster(link_bw=400), wl, OPTS)
    slow = sim.simulate(_pd_cluster(link_bw=2), wl, OPTS)
    extra_ms = (slow.requests_table().kv_transfer_ns.mean()
                - fast.requests_table().kv_transfer_ns.mean()) / 1e6
    assert extra_ms > 100
    gain = slow.summary["ttft_ms"]["mean"] - fast.summary["ttft_ms"]["mean"]
    assert gain == pytest.approx(extra_ms, rel=0.05)
    assert slow.summary["tpot_ms"]["mean"] == pytest.approx(fast.summary["tpot_ms"]["mean"],
                                                            rel=0.05)


def test_decode_admission_waits_for_blocks():
    # A decode instance with little KV room: transferred requests queue until blocks free up,
    # but every request still completes and transfers equal prefills.
    cluster = _pd_cluster(prefill=2, decode=1, mem_util=0.2)
    wl = _workload([2000] * 20, output=64, gap_ns=10_000_000)
    res = sim.simulate(cluster, wl, OPTS)
    assert res.summary["num_finished"] == 20
    assert res.summary["kv_transfers"] == 20
    t = res.requests_table()
    assert (t.output_tokens == 64).all()


@pytest.mark.parametrize("policy", ["LOAD", "RR", "LEAST_KV"])
def test_decode_policies_spread_over_decode_instances(policy):
    # Requests overlap on the decode side (long outputs, close arrivals).
    res = sim.simulate(_pd_cluster(prefill=1, decode=2),
                       _workload([800] * 10, output=200, gap_ns=5_000_000),
                       OPTS.replace(pd_decode_policy=policy))
    assert set(res.requests_table().instance_id) == {1, 2}


def test_pd_type_without_counterpart_is_refused(tmp_path):
    bad = json.loads(json.dumps({"num_nodes": 1, "link_bw": 16, "link_latency": 0, "nodes": [{
        "num_instances": 1, "instances": [{
            "model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0}, "pd_type": "prefill"}]}]}))
    with pytest.raises(sim.InputError, match="decode"):
        sim.validate_cluster(sim.parse_cluster(bad), OPTS)
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(bad))
    ds = tmp_path / "w.jsonl"
    ds.write_text('{"input_toks": 10, "output_toks": 2, "arrival_time_ns": 0}\n')
    proc = subprocess.run([sys.executable, "-m", "sim", "run", "--cluster", str(cfg), "--dataset",
                           str(ds), "--output", str(tmp_path / "o.csv"), "--latency-provider",
                           "roofline"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "pd_type" in proc.stderr
