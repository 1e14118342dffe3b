"""KV capacity as vLLM 0.19 derives it (sim/memory.py): gpu_memory_utilization is a share
of the device total, from which the weights, the profile run's activation peak and the
non-torch memory are taken before the blocks are counted."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

import sim
from sim.errors import InputError
from sim.memory import (activation_peak_bytes, device_total_bytes, kv_capacity_blocks,
                        memory_budget, pp_stage_layers)
from sim.model import load_model
from sim_testkit import flat_workload, make_cluster, opts_for

LLAMA = "meta-llama/Llama-3.1-8B"


def _instance(hardware="RTX4090", mem_size=24, util=0.9, model=LLAMA, **kw):
    c = sim.parse_cluster({"num_nodes": 1, "nodes": [{"num_instances": 1, "instances": [{
        "model_name": model, "hardware": hardware, "num_npus": kw.get("tp_size", 1),
        "npu_mem": {"mem_size": mem_size, "mem_bw": 1008, "mem_latency": 0, "mem_util": util},
        **kw}]}]})
    return c.instances[0]


def test_rtx4090_llama_8b_matches_vllm_block_count():
    """The real run (vLLM 0.19, gpu_memory_utilization 0.9, max_num_batched_tokens 2048,
    max_num_seqs 256) logged 2,588 blocks of 16 tokens on a card CUDA reports as
    25,250,627,584 bytes. The old rule (mem_size x util - weights) gave ~3,400."""
    inst = _instance()
    assert device_total_bytes(inst) == 25_250_627_584
    blocks = kv_capacity_blocks(inst, load_model(LLAMA), 16, 2048, 256)
    assert blocks == 2588


def test_rtx4090_budget_parts_match_vllm_log_lines():
    b = memory_budget(_instance(), load_model(LLAMA), 16, 2048, 256)
    lines = b.log_lines(32768)
    # vLLM logs "Model loading took 14.99 GiB memory" for Llama-3.1-8B (parameters + rotary).
    assert lines[0] == "Model loading took 14.99 GiB memory"
    assert f"GPU KV cache size: {b.num_blocks * 16:,} tokens" in lines
    assert f"Maximum concurrency for 32,768 tokens per request: {b.num_blocks / 2048:.2f}x" \
        in lines
    assert lines[-1] == ("vllm cache_config_info with initialization after num_gpu_blocks is: "
                         f"{b.num_blocks}")
    assert b.requested_bytes == math.ceil(25_250_627_584 * 0.9)
    assert b.kv_bytes == b.requested_bytes - b.weight_bytes - b.activation_bytes - b.non_torch_bytes


def test_activation_peak_grows_with_token_budget_and_sequences():
    """The profile run's peak follows max_num_batched_tokens (forward pass) and
    max_num_seqs (one row of logits per dummy request in the sampler run)."""
    m = load_model(LLAMA)
    inst = _instance(hardware="H100-SXM", mem_size=80)
    by_tokens = [kv_capacity_blocks(inst, m, 16, n, 256) for n in (2048, 8192, 32768)]
    assert by_tokens[0] >= by_tokens[1] > by_tokens[2]
    # at a 2,048-token budget the sampler run binds from 256 rows (vLLM 0.19's Triton
    # sampler: logits, their float32 copies and scratch rows of the whole vocabulary)
    by_seqs = [kv_capacity_blocks(inst, m, 16, 2048, s) for s in (64, 256, 1024)]
    assert by_seqs[0] > by_seqs[1] > by_seqs[2]
    # the sampler run: R x vocab logits, R = min(max_num_seqs, max_num_batched_tokens)
    assert activation_peak_bytes(m, 1, 1, 128, 1024) == activation_peak_bytes(m, 1, 1, 128, 128)


def test_mem_util_means_share_of_device_total():
    m = load_model(LLAMA)
    lo = memory_budget(_instance(util=0.85), m, 16, 2048, 256)
    hi = memory_budget(_instance(util=0.9), m, 16, 2048, 256)
    # 5% more of the device is 5% of its total more KV memory; nothing else moves.
    assert hi.kv_bytes - lo.kv_bytes == pytest.approx(0.05 * 25_250_627_584, abs=2)
    assert hi.activation_bytes == lo.activation_bytes


def test_tensor_parallel_worker_holds_comm_buffers_and_a_shard():
    m = load_model(LLAMA)
    one = memory_budget(_instance(hardware="H100-SXM", mem_size=80), m, 16, 2048, 256)
    two = memory_budget(_instance(hardware="H100-SXM", mem_size=80, tp_size=2), m, 16, 2048, 256)
    assert two.non_torch_bytes > one.non_torch_bytes
    assert two.weight_bytes < one.weight_bytes
    assert two.block_bytes * 2 == one.block_bytes  # half the KV heads per worker


def test_no_room_names_the_activation_and_the_limits():
    inst = _instance(util=0.67)  # 15.8 GiB requested: the weights fit, the profile run not
    with pytest.raises(InputError, match="peak activation .*max_num_batched_tokens=2048"):
        memory_budget(inst, load_model(LLAMA), 16, 2048, 256)


def test_num_gpu_blocks_override_is_honoured():
    inst = _instance(num_gpu_blocks_override=1000)
    assert kv_capacity_blocks(inst, load_model(LLAMA), 16) == 1000
    with pytest.raises(InputError, match="num_gpu_blocks_override"):
        _instance(num_gpu_blocks_override=0)


def test_summary_reports_kv_cache_as_vllm_logs_it(bundle_root):
    r = sim.simulate(make_cluster(300), flat_workload([(0, 40, 3)]), opts_for(bundle_root))
    kv = r.summary["kv_cache"]["0"]
    assert kv["num_blocks"] == r.summary["kv_blocks"]["0"] == 300
    assert kv["kv_tokens"] == 300 * 16
    assert kv["max_concurrency"] == round(300 / -(-kv["max_model_len"] // 16), 2)


def test_validation_cluster_derives_vllm_blocks_at_the_runs_utilisation():
    """The shared RTX 4090 validation cluster replayed at the real run's 0.9 (not a
    calibrated mem_util) gives vLLM's block count."""
    from sim.paths import shared_data_root
    path = shared_data_root() / "validation/RTX4090-Llama-3.1-8B/cluster.json"
    if not path.exists():
        pytest.skip(f"shared validation data not available: {path} is missing")
    inst = sim.load_cluster(path).with_mem_util(0.9).instances[0]
    assert inst.npu_mem.mem_util == 0.9
    inst = replace(inst, num_gpu_blocks_override=None)
    assert kv_capacity_blocks(inst, load_model(LLAMA), 16, 2048, 256) == pytest.approx(
        2588, rel=0.01)


def test_cli_gpu_memory_utilization_replaces_the_cluster_files_mem_util(tmp_path):
    """`llmsim run --gpu-memory-utilization 0.9` on the validation cluster (whose file carries
    a calibrated 0.833919) derives vLLM's block count; out-of-range values exit 2."""
    import json
    import subprocess
    import sys

    from sim.paths import shared_data_root
    root = shared_data_root()
    cluster = root / "validation/RTX4090-Llama-3.1-8B/cluster.json"
    if not cluster.exists():
        pytest.skip(f"shared validation data not available: {cluster} is missing")
    base = [sys.executable, "-m", "sim", "run", "--cluster", str(cluster), "--dataset",
            str(root / "workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl"), "--num-reqs", "5",
            "--max-num-seqs", "256", "--max-num-batched-tokens", "2048"]
    out = tmp_path / "r.csv"
    proc = subprocess.run(base + ["--gpu-memory-utilization", "0.9", "--output", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert abs(summary["kv_blocks"]["0"] - 2588) / 2588 < 0.01
    bad = subprocess.run(base + ["--gpu-memory-utilization", "1.5", "--output", str(out)],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "--gpu-memory-utilization" in bad.stderr
    assert "Traceback" not in bad.stderr
    # --kv-cache-memory-bytes: 4 GiB of KV cache = 2,048 blocks of 16 tokens x 128 KiB
    proc = subprocess.run(base + ["--kv-cache-memory-bytes", str(4 << 30), "--output", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["kv_blocks"]["0"] == 2048
    for value, needle in (("0", "--kv-cache-memory-bytes must be an integer in 1..1e15"),
                          (str(40 << 30), "kv_cache_memory_bytes=42,949,672,960 does not fit")):
        bad = subprocess.run(base + ["--kv-cache-memory-bytes", value, "--output", str(out)],
                             capture_output=True, text=True, check=False)
        assert bad.returncode == 2 and needle in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr


def test_pp_stage_layers_follow_vllm_get_pp_indices():
    from sim.memory import pp_stage_layers
    assert pp_stage_layers(32, 1) == [32]
    assert pp_stage_layers(32, 2) == [16, 16]
    # the remainder goes to the stages before the last, from the second-to-last backwards
    assert pp_stage_layers(32, 3) == [11, 11, 10]
    assert pp_stage_layers(30, 4) == [7, 8, 8, 7]
    assert pp_stage_layers(33, 4) == [8, 8, 9, 8]


def test_pp_blocks_are_the_smallest_stage_count_with_each_stage_its_own_memory():
    # Each pipeline stage's worker profiles its own memory (its layers, the embedding on
    # the first, the lm_head and sampler run on the last) and sizes its cache for its own
    # layers; vLLM keeps the smallest count. Before, every stage was charged the largest
    # stage's layers and the sampler at once, which undercounts.
    from sim.memory import device_traits, forward_peak_bytes, non_torch_bytes, pp_stage_layers
    m = load_model(LLAMA)
    inst = _instance(hardware="H100-SXM", mem_size=80, pp_size=3, num_npus=3)
    requested = int(device_total_bytes(inst) * 0.9)
    rotary = m.max_position_embeddings * m.head_dim * m.dtype_bytes
    per_layer = m.kv_bytes_per_token(1, 1) // m.num_hidden_layers * 16
    counts = []
    for s, layers in enumerate(pp_stage_layers(m.num_hidden_layers, 3)):
        weights = m.stage_weight_bytes(1, layers, s == 0, s == 2) + rotary
        # the sampler run on the last stage; every stage's first GEMM allocates the 32 MiB
        # cuBLAS workspace (compute capability 9.0)
        act = (activation_peak_bytes(m, 1, 1, 2048, 256, device_traits("H100-SXM")) if s == 2
               else forward_peak_bytes(m, 2048, 1, 1) + (32 << 20))
        counts.append((requested - weights - act - non_torch_bytes(inst)) // (per_layer * layers))
    b = memory_budget(inst, m, 16, 2048, 256)
    assert b.num_blocks == min(counts)
    # the 10-layer last stage holds more blocks than the 11-layer ones
    assert counts[2] > counts[0]
    # a stage's weights: the whole model's parameters split over the stages (+ a second
    # vocabulary matrix where the lm_head is tied but lives apart from the embedding)
    stages = sum(m.stage_weight_bytes(1, n, s == 0, s == 2)
                 for s, n in enumerate(pp_stage_layers(m.num_hidden_layers, 3)))
    assert stages == pytest.approx(m.weight_bytes(1, 1, 1), rel=1e-6)


# ---- byte-exact where vLLM is exact ------------------------------------------------------

def test_llama_8b_weights_are_its_exact_parameter_count():
    """Llama-3.1-8B has 8,030,261,248 parameters (embedding + 32 blocks + final RMSNorm +
    lm_head); the loader's bytes are those in bf16 plus the rotary cos/sin table. Before,
    the final norm (4,096 parameters) was left out of the weights."""
    m = load_model(LLAMA)
    assert m.param_count() == 8_030_261_248
    assert m.stage_weight_bytes(1, 32, True, True) == 8_030_261_248 * 2
    rotary = 131072 * 128 * 2
    assert memory_budget(_instance(), m, 16, 2048, 256).weight_bytes == 8_030_261_248 * 2 + rotary
    # a pipeline split keeps every parameter once (the final norm on the last stage)
    split = m.stage_weight_bytes(1, 16, True, False) + m.stage_weight_bytes(1, 16, False, True)
    assert split == 8_030_261_248 * 2


@pytest.mark.parametrize("name,params", [
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", 30_532_122_624),   # incl. q_norm/k_norm per layer
    ("meta-llama/Llama-3.1-70B", 70_553_706_496),
    ("Qwen/Qwen3-32B", 32_762_123_264),
])
def test_unquantized_weights_are_the_parameter_count_in_the_model_dtype(name, params):
    m = load_model(name)
    assert m.param_count() == params
    assert m.stage_weight_bytes(1, m.num_hidden_layers, True, True) == params * m.dtype_bytes


def test_requested_memory_rounds_up_to_a_whole_byte():
    """vLLM's request_memory: math.ceil(total x gpu_memory_utilization)."""
    from sim.memory import request_memory
    assert request_memory(25_250_627_584, 0.9) == 22_725_564_826   # 22,725,564,825.6
    assert request_memory(1000, 0.5) == 500


def test_max_concurrency_counts_whole_blocks_per_request():
    """vLLM divides the blocks by cdiv(max_model_len, block_size), the whole blocks one
    request of max_model_len tokens holds (not tokens / max_model_len)."""
    from sim.memory import blocks_per_request
    b = memory_budget(_instance(num_gpu_blocks_override=1000), load_model(LLAMA), 16, 2048, 256)
    assert blocks_per_request(1000, 16) == 63
    assert b.max_concurrency(1000) == pytest.approx(1000 / 63)      # 15.87x, not 16.00x
    assert "Maximum concurrency for 1,000 tokens per request: 15.87x" in b.log_lines(1000)
    assert b.max_concurrency(32768) == 1000 / 2048


def test_log_lines_are_worded_like_vllm_0_19():
    """vLLM 0.19's start-up lines (gpu_model_runner "Model loading took", gpu_worker's
    memory profiling and "Available KV cache memory", kv_cache_utils' "GPU KV cache size"
    and "Maximum concurrency", metrics/loggers' "num_gpu_blocks is"), GiB as format_gib
    writes it (round to 2 decimals)."""
    from sim.memory import format_gib
    assert format_gib(16 * 1024**3) == "16.0" and format_gib(int(14.987 * 1024**3)) == "14.99"
    b = memory_budget(_instance(), load_model(LLAMA), 16, 2048, 256)
    lines = b.log_lines(32768)
    non_kv = b.weight_bytes + b.activation_bytes + b.non_torch_bytes
    assert lines == [
        "Model loading took 14.99 GiB memory",
        f"worker requested memory: {format_gib(b.requested_bytes)}GiB",
        f"Total non KV cache memory: {format_gib(non_kv)}GiB; torch peak memory increase: "
        f"{format_gib(b.activation_bytes)}GiB; non-torch forward increase memory: "
        f"{format_gib(b.non_torch_bytes)}GiB; weights memory: 14.99GiB.",
        f"Available KV cache memory: {format_gib(b.kv_bytes)} GiB",
        f"GPU KV cache size: {b.num_blocks * 16:,} tokens",
        f"Maximum concurrency for 32,768 tokens per request: {b.num_blocks / 2048:.2f}x",
        f"vllm cache_config_info with initialization after num_gpu_blocks is: {b.num_blocks}",
    ]
    over = memory_budget(_instance(num_gpu_blocks_override=1000), load_model(LLAMA), 16,
                         2048, 256)
    assert (f"Overriding num_gpu_blocks={b.num_blocks} with num_gpu_blocks_override=1000"
            in over.log_lines())


def test_rtx_pro_6000_budget_is_a_share_of_what_cuda_reports():
    """vLLM's requested memory is gpu_memory_utilization x the total CUDA reports, 94.97 GiB
    on an RTX PRO 6000 Blackwell (PyTorch's OOM message), not the nominal 96 GiB."""
    from sim.cluster import GiB as _GiB
    from sim.hardware import load_hardware

    assert f"{load_hardware('RTXPRO6000').mem_visible_fraction * 96:.2f}" == "94.97"
    c = sim.parse_cluster({"num_nodes": 1, "link_bw": 16, "link_latency": 1000, "nodes": [{
        "num_instances": 1, "cpu_mem": {"mem_size": 64, "mem_bw": 50, "mem_latency": 0},
        "instances": [{"model_name": "meta-llama/Llama-3.1-8B", "hardware": "RTXPRO6000",
                       "npu_mem": {"mem_size": 96, "mem_bw": 1597, "mem_latency": 0},
                       "num_npus": 1}]}]})
    assert f"{device_total_bytes(c.instances[0]) / _GiB:.2f}" == "94.97"


def _reserved(kv_bytes: int, **extra):
    return _instance(hardware="H100-SXM", mem_size=80, kv_cache_memory_bytes=kv_bytes, **extra)


def test_kv_cache_memory_bytes_sets_the_cache_whatever_the_utilization():
    """vLLM's kv_cache_memory_bytes: each worker's KV cache is that many bytes (its blocks
    of 16 tokens x the layers' KV), gpu_memory_utilization and the profile run aside; it
    was not an input before."""
    m = load_model(LLAMA)
    per_block = m.kv_bytes_per_token(1, 1) * 16
    b = memory_budget(_reserved(10 << 30), m, 16, 2048, 256)
    assert b.num_blocks == (10 << 30) // per_block and b.kv_bytes == 10 << 30
    low = memory_budget(replace(_reserved(10 << 30), npu_mem=replace(
        _reserved(10 << 30).npu_mem, mem_util=0.3)), m, 16, 2048, 256)
    assert low.num_blocks == b.num_blocks
    assert any("Reserved 10.0 GiB for KV cache as specified by kv_cache_memory_bytes" in ln
               for ln in b.log_lines())
    # with pipeline stages the stage with the most layers has the fewest blocks
    pp = memory_budget(_reserved(10 << 30, pp_size=3, num_npus=3), m, 16, 2048, 256)
    layers = max(pp_stage_layers(m.num_hidden_layers, 3))
    assert pp.num_blocks == (10 << 30) // (m.kv_bytes_per_token(1, 1) // m.num_hidden_layers
                                            * 16 * layers)


def test_kv_cache_memory_bytes_past_the_device_is_refused():
    m = load_model(LLAMA)
    with pytest.raises(InputError, match=r"kv_cache_memory_bytes=85,899,345,920 does not fit"):
        memory_budget(_reserved(80 << 30), m, 16, 2048, 256)
