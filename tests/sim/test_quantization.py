"""FP8 (W8A8 weights, FP8 KV cache) in model specs, capacity, providers and inputs (#17)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest

import sim
from sim.backend import _act_bytes
from sim.cli import main
from sim.cluster import GiB
from sim.engine import build_instances
from sim.memory import memory_budget
from sim.errors import InputError
from sim.latency.base import BatchShape, load_providers
from sim.latency.roofline import RooflineProvider
from sim.model import _from_mapping, from_hf_config, load_model

HAS_AIC = importlib.util.find_spec("aiconfigurator_core") is not None


def test_fp8_checkpoints_in_the_catalogue():
    for name in ("RedHatAI/Llama-3.1-8B-Instruct-FP8", "Llama-3.1-70B-FP8", "Qwen/Qwen3-32B-FP8",
                 "Qwen/Qwen3-235B-A22B-FP8"):
        m = load_model(name)
        assert m.quantization == "fp8" and m.dtype == "bfloat16" and m.precision == "fp8"
    assert load_model("Qwen3-235B-A22B-FP8").is_moe


def test_fp8_weight_and_kv_bytes():
    bf = load_model("meta-llama/Llama-3.1-8B")
    fp8 = load_model("Llama-3.1-8B-Instruct-FP8")
    linear = bf.num_hidden_layers * (bf.attention_params() + bf.mlp_params())
    # linear layers at 1 byte; embedding, lm_head and norms stay bf16
    assert bf.weight_bytes() - fp8.weight_bytes() == linear
    # vLLM reports ~8.5 GiB loaded for this checkpoint (15 GiB in bf16)
    assert 8.3 < fp8.weight_bytes() / GiB < 8.6 and 14.8 < bf.weight_bytes() / GiB < 15.1
    assert fp8.weight_bytes(quant=None) == bf.weight_bytes()
    kv8 = bf.with_precision(kv_cache_dtype="fp8")
    assert kv8.kv_bytes_per_token() * 2 == bf.kv_bytes_per_token()
    assert bf.kv_bytes_per_token(kv_dtype="fp8_e4m3") == kv8.kv_bytes_per_token()
    moe = load_model("Qwen3-235B-A22B-FP8")
    router = moe.num_hidden_layers * moe.hidden_size * moe.num_experts
    assert moe.weight_bytes(quant=None) - moe.weight_bytes() == \
        moe.num_hidden_layers * (moe.attention_params() + moe.mlp_params()) - router


def test_kv_capacity_grows_with_fp8():
    c = sim.parse_cluster({"num_nodes": 1, "link_bw": 450, "link_latency": 500, "nodes": [{
        "num_instances": 1, "instances": [{
            "model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM", "num_npus": 1,
            "tp_size": 1, "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0}}]}]})
    inst = c.instances[0]
    bf = load_model("meta-llama/Llama-3.1-8B")
    blocks = {p: memory_budget(inst, bf.with_precision(*p), 16, 2048, 256).num_blocks
              for p in ((None, "auto"), ("fp8", "auto"), ("fp8", "fp8"))}
    assert blocks[("fp8", "auto")] > blocks[(None, "auto")]
    assert blocks[("fp8", "fp8")] == pytest.approx(2 * blocks[("fp8", "auto")], abs=1)
    # the same through the cluster config's per-instance fields
    c8 = sim.parse_cluster(_cluster_dict("fp8", "fp8"))
    rt = build_instances(c8, sim.SimOptions(latency_provider="roofline"))[0]
    assert rt.model.precision == "fp8+kv-fp8" and rt.num_kv_blocks == blocks[("fp8", "fp8")]


def _cluster_dict(quant=None, kv=None, model="meta-llama/Llama-3.1-8B", hw="H100-SXM",
                  mem=80, tp=1) -> dict:
    inst = {"model_name": model, "hardware": hw, "num_npus": tp, "tp_size": tp,
            "npu_mem": {"mem_size": mem, "mem_bw": 3350, "mem_latency": 0}}
    if quant:
        inst["quantization"] = quant
    if kv:
        inst["kv_cache_dtype"] = kv
    return {"num_nodes": 1, "link_bw": 450, "link_latency": 500,
            "nodes": [{"num_instances": 1, "instances": [inst]}]}


def test_roofline_fp8_gemm_attention_and_lm_head():
    bf = load_model("meta-llama/Llama-3.1-8B")
    r16 = RooflineProvider(bf, "H100-SXM", 1)
    r8 = RooflineProvider(bf.with_precision("fp8"), "H100-SXM", 1)
    rkv = RooflineProvider(bf.with_precision("fp8", "fp8"), "H100-SXM", 1)
    big = BatchShape(8192, 1, prefill_tokens=8192)
    dec = BatchShape(8, 8, num_decode=8, decode_kv_sum=8 * 4096, decode_kv_max=4096)
    for shape, lo, hi in ((big, 1.6, 2.05), (dec, 1.5, 2.05)):   # compute- / memory-bound
        a = dict(r16.layer_times(shape).block)["gate_up_proj"]
        b = dict(r8.layer_times(shape).block)["gate_up_proj"]
        assert lo < a / b < hi, (shape, a, b)
    assert dict(r8.layer_times(dec).head)["lm_head"] == dict(r16.layer_times(dec).head)["lm_head"]
    a16, a8 = (dict(p.layer_times(dec).block)["attention"] for p in (r8, rkv))
    assert a8 < 0.7 * a16                          # decode attention reads half the KV bytes
    assert r8.source == "roofline(H100-SXM, fp8)" and r16.source == "roofline(H100-SXM)"


@pytest.mark.skipif(not HAS_AIC, reason="aiconfigurator-core not installed")
def test_aic_selects_fp8_gemm_and_kv_modes():
    from sim.latency.aic import quant_modes
    bf = load_model("meta-llama/Llama-3.1-8B")
    assert quant_modes(bf) == {}
    assert quant_modes(bf.with_precision("fp8", "fp8")) == {
        "gemm_quant_mode": "fp8", "kvcache_quant_mode": "fp8"}
    # Qwen's FP8 releases scale their weights in 128 x 128 blocks: vLLM's block-scaled
    # GEMM and fused-MoE kernels, measured apart (fp8_block) in aiconfigurator's data
    assert quant_modes(load_model("Qwen3-235B-A22B-FP8")) == {
        "gemm_quant_mode": "fp8_block", "moe_quant_mode": "fp8_block"}
    assert quant_modes(load_model("Llama-3.1-70B-FP8")) == {"gemm_quant_mode": "fp8"}
    reg = load_providers()
    p16 = reg.create("aic", bf, "H100-SXM", 1)
    p8 = reg.create("aic", bf.with_precision("fp8"), "H100-SXM", 1)
    shape = BatchShape(4096, 1, prefill_tokens=4096)
    g16, g8 = (dict(p.layer_times(shape).block)["gate_up_proj"] for p in (p16, p8))
    assert g8 < 0.8 * g16 and "fp8" in p8.source
    pkv = reg.create("aic", bf.with_precision("fp8", "fp8"), "H100-SXM", 1)
    dec = BatchShape(32, 32, num_decode=32, decode_kv_sum=32 * 4096, decode_kv_max=4096)
    a8, akv = (dict(p.layer_times(dec).block)["attention"] for p in (p8, pkv))
    assert akv < 0.85 * a8    # FP8 KV: aiconfigurator's measured FP8-cache decode attention


@pytest.mark.skipif(not HAS_AIC, reason="aiconfigurator-core not installed")
def test_aic_block_fp8_experts_cost_less_than_bf16_ones():
    """FP8 experts read half the bytes of bf16 ones. With the per-tensor (ModelOpt) FP8
    data a block-scaled checkpoint was modelled with before, Qwen3-235B-A22B-FP8's experts
    on four H100s cost 2.5x the bf16 model's at decode batches (1,148 against 451 us)."""
    fp8 = load_model("Qwen3-235B-A22B-FP8")
    bf16 = replace(fp8, quantization=None, weight_block_size=None)
    reg = load_providers()
    p8, p16 = (reg.create("aic", m, "H100-SXM", 4) for m in (fp8, bf16))
    for tokens in (8, 32, 128, 512):
        assert p8.moe_ns(tokens) < 0.85 * p16.moe_ns(tokens), tokens


def test_fp8_weight_blocks_in_specs(tmp_path):
    assert load_model("Qwen/Qwen3-32B-FP8").weight_block_size == (128, 128)
    assert load_model("Llama-3.1-8B-FP8").weight_block_size is None
    # vLLM's online --quantization fp8 of a bf16 checkpoint scales per tensor
    assert load_model("Qwen/Qwen3-32B").with_precision("fp8").weight_block_size is None
    assert load_model("Qwen/Qwen3-32B-FP8").with_precision(None, "fp8").weight_block_size \
        == (128, 128)
    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 64}
    for bad in ([128], [0, 128], [True, 128], 128, "128x128"):
        p = tmp_path / "config.json"
        p.write_text(json.dumps({**base, "quantization_config": {
            "quant_method": "fp8", "weight_block_size": bad}}))
        with pytest.raises(InputError, match="weight_block_size.*two positive integers") as e:
            from_hf_config(p)
        assert e.value.source == str(p)
    spec = {k: v for k, v in base.items() if k != "model_type"}
    with pytest.raises(InputError, match="weight_block_size.*quantization: fp8"):
        _from_mapping({**spec, "name": "x", "architecture": "llama",
                       "weight_block_size": [128, 128]}, "x.yaml")


def test_measured_never_uses_another_precision(bundle_root):
    from sim_testkit import make_bundle
    make_bundle(bundle_root, hardware="RTX4090")
    fp8 = load_model("meta-llama/Llama-3.1-8B").with_precision("fp8")
    with pytest.raises(InputError, match=r"variant 'fp8' \(has only bf16"):
        load_providers().create("measured", fp8, "RTX4090", 1, profiles_dirs=(str(bundle_root),))


def test_all_reduce_volume_stays_bf16_under_w8a8():
    """vLLM's FP8 linear layers return bf16 outputs: the TP all-reduce moves bf16."""
    c = sim.parse_cluster(_cluster_dict("fp8", tp=2))
    rt = build_instances(c, sim.SimOptions(latency_provider="roofline"))[0]
    assert _act_bytes(rt, BatchShape(128, 1, prefill_tokens=128)) == 128 * 4096 * 2


def test_hf_config_quantization_config(tmp_path):
    base = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
            "vocab_size": 128256, "torch_dtype": "bfloat16"}
    qcfgs = {"fp8": {"quant_method": "fp8", "weight_block_size": [128, 128]},
             "ct": {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
                 "weights": {"num_bits": 8, "type": "float"},
                 "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}},
                 "ignore": ["lm_head"]}}
    for name, q in qcfgs.items():
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({**base, "quantization_config": q}))
        assert from_hf_config(p).quantization == "fp8"
        assert from_hf_config(p).weight_block_size == ((128, 128) if name == "fp8" else None)
    p = tmp_path / "awq.json"
    p.write_text(json.dumps({**base, "quantization_config": {"quant_method": "awq"}}))
    with pytest.raises(InputError, match="awq.*not modelled"):
        from_hf_config(p)


def _err(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    return err[0]


def test_bad_fp8_input_exits_2(tmp_path, capsys):
    w = tmp_path / "w.jsonl"
    w.write_text(json.dumps({"input_toks": 10, "output_toks": 2, "arrival_time_ns": 0}) + "\n")

    def run(cluster: dict, *flags):
        c = tmp_path / "c.json"
        c.write_text(json.dumps(cluster))
        return _err(capsys, ["run", "--cluster", str(c), "--dataset", str(w), "--output",
                             str(tmp_path / "o.csv"), "--latency-provider", "roofline", *flags])

    assert "quantization" in run(_cluster_dict(), "--quantization", "int4")
    assert "'gptq'" in run(_cluster_dict("gptq"))
    assert "kv_cache_dtype" in run(_cluster_dict(kv="fp4"))
    line = run(_cluster_dict("fp8", hw="A100-80G-SXM"))
    assert "A100-80G-SXM" in line and "fp8" in line
    line = run(_cluster_dict(model="Qwen3-235B-A22B-FP8", tp=2, mem=80))
    assert "weights need" in line and "Qwen3-235B-A22B-FP8" in line


def test_block_scaled_fp8_shards_must_be_whole_blocks(tmp_path, capsys):
    """vLLM refuses to load block-scaled FP8 weights whose TP shard is not a whole number of
    scale blocks (Fp8LinearMethod / the FP8 MoE method: an output shard a multiple of
    block_n, an input shard of block_k): Qwen3-235B-A22B-FP8's experts (1,536 wide, 128 x
    128 blocks) cannot run at TP 8 without expert parallelism (192 a rank), nor in a DP 2
    group without EP at TP 4 (vLLM flattens the experts over dp x tp = 8). With EP each
    rank holds whole experts. Before, the simulator (auto: the roofline, after aic said
    so) ran the configuration vLLM cannot."""
    model = load_model("Qwen3-235B-A22B-FP8")
    model.check_weight_blocks(4, 4)
    model.check_weight_blocks(8, 1)           # EP 8: whole experts
    with pytest.raises(InputError, match=r"192.*128"):
        model.check_weight_blocks(8, 8)
    load_model("Llama-3.1-70B-FP8").check_weight_blocks(8, 8)   # per-tensor scales

    def run(inst_extra, top_extra=None):
        inst = {"model_name": "Qwen3-235B-A22B-FP8", "hardware": "H100-SXM",
                "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
                "num_npus": 8, "tp_size": 8, **inst_extra}
        c = tmp_path / "c.json"
        c.write_text(json.dumps({"num_nodes": 1, "nodes": [{"num_instances": 1,
                                                             "instances": [inst]}]}))
        w = tmp_path / "w.jsonl"
        w.write_text(json.dumps({"input_toks": 10, "output_toks": 2, "arrival_time_ns": 0})
                     + "\n")
        return main(["run", "--cluster", str(c), "--dataset", str(w), "--output",
                     str(tmp_path / "o.csv"), "--latency-provider", "roofline"])

    assert run({}) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "192" in err[0] and "ep_size" in err[0] \
        and "Traceback" not in err[0], err
    assert run({"ep_size": 8}) == 0
