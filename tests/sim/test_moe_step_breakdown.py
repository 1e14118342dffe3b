"""experiments/moe_step_breakdown.py: the per-phase prompt-token cost, the prompts admitted
into full ranks, the bundle's mixed-batch attention penalty, and the recorded waves' shapes."""

from __future__ import annotations

import pytest

import sim
from experiments.moe_step_breakdown import (admitted_when_full, decode_step_line,
                                            filling_and_drain, per_second_rows,
                                            prompt_token_cost, split_mixed_attention)
from sim.engine import Simulator
from sim.gate import GATE_POLICIES
from sim.latency.base import BatchShape
from sim.latency.measured import MeasuredProvider
from sim.model import load_model
from sim.paths import shared_data_root

MOE = "Qwen/Qwen3-30B-A3B-Instruct-2507"


def _series(a=20.0, b=0.1, c_us=30.0):
    """Per-second (prompt, generated, running) of a run whose decode step is a + b x running
    ms and whose prompt tokens cost c_us each: it fills to 100 running, stays full, drains."""
    running = [10, 30, 50, 70, 90, 100, 100, 100, 100, 80, 60, 40, 20]
    prompt = [8000, 9000, 7000, 6000, 5000, 3000, 2000, 1000, 500, 0, 0, 0, 0]
    gen = []
    for i, r in enumerate(running):
        rr = r if i == 0 else (running[i - 1] + r) / 2
        steps = (1000.0 - prompt[i] * c_us / 1e3) / (a + b * rr)
        gen.append(steps * rr)
    return prompt, gen, running


def test_prompt_token_cost_recovers_a_known_run():
    prompt, gen, running = _series()
    rows = per_second_rows(prompt, gen, running)
    filling, drain = filling_and_drain(rows, 100)
    assert [r[0] for r in filling] == [3, 4, 5]  # from the third second to the first full one
    assert [r[0] for r in drain] == [9, 10, 11, 12]
    a, b = decode_step_line(drain)
    assert a == pytest.approx(20.0) and b == pytest.approx(0.1)
    assert prompt_token_cost(filling, (a, b)) == pytest.approx(30.0)
    with pytest.raises(ValueError):
        decode_step_line(drain[:1])


class _Req:
    def __init__(self, rid, sched_ms, first_ms):
        self.rid, self.first_scheduled_ns = rid, int(sched_ms * 1e6)
        self.first_token_ns = int(first_ms * 1e6)


def test_admitted_when_full_pairs_by_position_and_keeps_waiting_one_chunk_prompts():
    rows = [
        {"input_toks": 400, "queued_ts": 0.0, "scheduled_ts": 0.1, "first_token_ts": 0.2},
        {"input_toks": 400, "queued_ts": 0.0, "scheduled_ts": 2.0, "first_token_ts": 2.12},
        {"input_toks": 5000, "queued_ts": 0.0, "scheduled_ts": 2.0, "first_token_ts": 2.4},
        {"input_toks": 800, "queued_ts": 1.0, "scheduled_ts": 3.0, "first_token_ts": 3.14},
    ]
    reqs = [_Req(0, 0, 90), _Req(1, 10, 140), _Req(2, 0, 300), _Req(3, 20, 170)]
    x, real, rep = admitted_when_full(rows, reqs)
    assert list(x) == [400, 800]  # no wait for the first, the third is over one chunk
    assert list(real) == pytest.approx([120.0, 140.0])
    assert list(rep) == pytest.approx([130.0, 150.0])


BUNDLE = shared_data_root() / "profiles" / "RTXPRO6000" / "Qwen" / \
    "Qwen3-30B-A3B-Instruct-2507" / "bf16"


@pytest.mark.shared
@pytest.mark.skipif(not (BUNDLE / "tp1" / "attention.csv").is_file(),
                    reason=f"shared measured bundle not found at {BUNDLE}")
def test_split_mixed_attention_shows_the_bundles_mixed_batch_penalty():
    prov = MeasuredProvider(load_model(MOE), "RTXPRO6000", 1, bundle=BUNDLE)
    kv = 1024
    for nd in (16, 128):
        mixed = BatchShape(nd + 16, nd + 1, prefill_tokens=16, num_decode=nd,
                           decode_kv_sum=nd * kv, decode_kv_max=kv, decode_kv_min=kv)
        both, dec, pre = split_mixed_attention(prov, mixed)
        # the bundle's own points: 128 decodes at KV 1,024 take 230 us alone and 645 us
        # beside a 16-token chunk (a 16-token chunk alone: 8 us)
        assert both > dec + pre
    assert both == pytest.approx(644_546, rel=0.01)
    assert dec == pytest.approx(230_263, rel=0.01)
    assert pre == pytest.approx(8_128, rel=0.01)


def _dp2_ep2():
    inst = {"model_name": MOE, "hardware": "H100-SXM", "num_npus": 1, "tp_size": 1,
            "ep_size": 2, "dp_group": "A",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0}}
    return sim.parse_cluster({"num_nodes": 1, "link_bw": 64, "link_latency": 1000, "nodes": [{
        "num_instances": 2, "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 0},
        "instances": [inst, dict(inst)]}]})


def _decode(n, kv=1000):
    return BatchShape(n, n, 0, 0, n, n * kv, kv, kv)


def test_recorded_waves_keep_each_ranks_batch_and_plain_waves_do_not():
    s = Simulator(_dp2_ep2(), sim.SimOptions(latency_provider="roofline"))
    gate = GATE_POLICIES.create("BALANCED", 0)
    a, b = _decode(8), _decode(16)
    assert s.moe_wave.step(s.instances, [a, None], gate).shapes == ()
    s.moe_wave.record = []
    w = s.moe_wave.step(s.instances, [a, None], gate)
    assert w.shapes == (a, None) and s.moe_wave.record == [w]
    assert s.moe_wave.step(s.instances, [a, b], gate).shapes == (a, b)
    s.close()
