"""The roofline on H100 and H200 against GEMMs measured on those cards.

On the datasheet alone, with efficiencies fitted on RTX 4090 / RTX PRO 6000 bundles (where
GEMMs reach about the datasheet peak and compute adds to weight loads), the roofline was
15-25% fast on Hopper's compute-bound and memory-bound GEMMs and 15-30% slow at 256 tokens,
where Hopper's kernels overlap the two (experiments/roofline_hopper.py). The catalogue now
carries what the cards were measured to sustain (experiments/gpu_probe.py, readings in
experiments/data/gpu-2026-11-26/) and the roofline's GEMM classes run at those rates."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import pytest
import yaml

import sim
from sim.hardware import _from_mapping, load_hardware
from sim.latency.roofline import RooflineProvider, measured_ceiling
from sim.model import load_model
from sim.paths import REPO_ROOT

from experiments.roofline_hopper import DATA, roofline_errors

HOPPER = ("H100-SXM", "H200-SXM")


def _stream(hardware: str) -> dict:
    return json.loads((DATA / f"stream_{hardware}.json").read_text())


@pytest.mark.parametrize("hardware", HOPPER)
def test_hopper_gemms_within_a_few_percent_of_the_readings(hardware):
    hw = load_hardware(hardware)
    errors = roofline_errors(hw)
    assert statistics.median(abs(e) for e in errors.values()) < 0.05, errors
    # compute-bound (2048 tokens) and weight-streaming (1 token) ends of the big GEMMs
    for shape in ("gate_up_8b", "down_8b", "gate_up_32b"):
        assert abs(errors[(shape, 1)]) < 0.08, (shape, errors[(shape, 1)])
        assert abs(errors[(shape, 2048)]) < 0.12, (shape, errors[(shape, 2048)])
    # where compute and loads meet (256 tokens) Hopper overlaps them
    assert all(abs(e) < 0.12 for (_, tokens), e in errors.items() if tokens == 256), errors


@pytest.mark.parametrize("hardware", HOPPER)
def test_the_datasheet_alone_misses_them(hardware):
    """What the catalogue's measured fields fix (the test above fails without them)."""
    hw = dataclasses.replace(load_hardware(hardware), measured_gemm_tflops={},
                             measured_mem_bw_GBps=None, gemm_overlap_p=None)
    errors = roofline_errors(hw)
    assert statistics.median(abs(e) for e in errors.values()) > 0.10
    assert errors[("gate_up_8b", 2048)] < -0.12      # too fast where compute-bound
    assert errors[("gate_up_8b", 256)] > 0.12        # too slow at the ridge


@pytest.mark.parametrize("hardware", HOPPER)
def test_catalogue_fields_are_the_readings(hardware):
    hw = load_hardware(hardware)
    stream = _stream(hardware)
    peaks = json.loads((DATA / f"peaks_{hardware}.json").read_text())
    assert hw.mem_reported_bytes == stream["mem_get_info_total"] == peaks["total_memory_bytes"]
    sustained = max([stream["bf16_8192_tflops_stream"]]
                    + [r["tflops"] for k, r in stream.items() if k.endswith("@2048")])
    assert hw.measured_gemm_tflops["bf16"] == round(sustained)
    fp8 = DATA / f"stream_fp8_{hardware}.json"
    if fp8.is_file():     # the back-to-back FP8 GEMMs where measured, else one product
        fp8_stream = json.loads(fp8.read_text())
        best = max([fp8_stream["fp8_8192_tflops_stream"]]
                   + [r["tflops"] for k, r in fp8_stream.items() if k.endswith("@2048")])
        assert hw.measured_gemm_tflops["fp8"] == round(best)
    else:
        assert hw.measured_gemm_tflops["fp8"] == round(peaks["gemm"]["fp8_8192"]["tflops"])
    assert hw.measured_mem_bw_GBps == stream["gate_up_8b@1"]["weight_GBps"]


def test_measured_ceiling_never_speeds_a_card_up():
    assert measured_ceiling(1000.0, None, 1.06) == 1000.0
    assert measured_ceiling(1000.0, 2000.0, 1.06) == 1000.0
    assert measured_ceiling(1000.0, 530.0, 1.06) == pytest.approx(500.0)


def test_fp8_gemms_use_the_fp8_reading():
    hw = load_hardware("H100-SXM")
    bf16 = RooflineProvider(load_model("meta-llama/Llama-3.1-8B"), hw, 1)
    fp8 = RooflineProvider(load_model("Llama-3.1-8B-Instruct-FP8"), hw, 1)
    # 2048 tokens: compute-bound in both; FP8 at 1396 measured TFLOPS, bf16 at 754
    ratio = bf16.dense_ns("gate_up_proj", 2048) / fp8.dense_ns("gate_up_proj", 2048)
    assert 1.5 < ratio < 1.95, ratio


def test_unmeasured_classes_and_cards_keep_the_datasheet():
    h100 = load_hardware("H100-SXM")
    bare = dataclasses.replace(h100, measured_gemm_tflops={}, measured_mem_bw_GBps=None,
                               gemm_overlap_p=None)
    model = load_model("meta-llama/Llama-3.1-8B")
    a, b = RooflineProvider(model, h100, 1), RooflineProvider(model, bare, 1)
    assert a.dense_ns("layernorm", 512) == b.dense_ns("layernorm", 512)
    shape = sim.latency.base.BatchShape(num_tokens=64, num_seqs=64, prefill_tokens=0,
                                        prefill_kv=0, num_decode=64, decode_kv_sum=64 * 1000,
                                        decode_kv_max=1000, decode_kv_min=1000)
    assert a.attention_ns(shape) == b.attention_ns(shape)
    assert a.dense_ns("gate_up_proj", 2048) > 1.1 * b.dense_ns("gate_up_proj", 2048)
    assert not load_hardware("RTX4090").measured_gemm_tflops


GOOD = yaml.safe_load((REPO_ROOT / "profiles/hardware/H100-SXM.yaml").read_text())


@pytest.mark.parametrize("field,value,needles", [
    ("measured_gemm_tflops", {"int4": 100}, ["'measured_gemm_tflops.int4'", "bf16, fp16"]),
    ("measured_gemm_tflops", {"bf16": math.nan}, ["'measured_gemm_tflops.bf16'", "positive"]),
    ("measured_gemm_tflops", {"bf16": 0}, ["'measured_gemm_tflops.bf16'", "positive"]),
    ("measured_gemm_tflops", 700, ["'measured_gemm_tflops'", "dtype -> TFLOPS"]),
    ("measured_mem_bw_GBps", 0, ["'measured_mem_bw_GBps'", "> 0"]),
    ("measured_mem_bw_GBps", math.inf, ["'measured_mem_bw_GBps'", "finite"]),
    ("gemm_overlap_p", 0.5, ["'gemm_overlap_p'", "1..50"]),
    ("gemm_overlap_p", "3", ["'gemm_overlap_p'", "1..50"]),
])
def test_bad_measured_fields_are_refused(field, value, needles):
    d = dict(GOOD)
    d[field] = value
    with pytest.raises(sim.InputError) as exc:
        _from_mapping(d, "hw.yaml")
    msg = str(exc.value)
    assert msg.startswith("hw.yaml: "), msg
    for n in needles:
        assert n in msg, (n, msg)
