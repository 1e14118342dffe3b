"""sim/memory.py's vLLM 0.19 memory terms (experiments/vllm_memory_audit.py prints them)
checked against vLLM 0.19.0 start-up logs (H100) and the RTX 4090 validation run's block
count; experiments/validate_vllm.py reports the simulated block count next to vLLM's.

Before, sim/memory.py took vLLM <= 0.16's sort-based sampler peak (2.1-2.5 GiB too much at
the H100 runs' 1,024 rows) and a 0.13 GiB non-torch term on every device, two errors that
cancelled on the RTX 4090 run alone (2,586 blocks against 2,588)."""

from __future__ import annotations

import pytest

import sim
from experiments.vllm_memory_audit import (MEASUREMENT_NEEDED, blocks_with, derive, h100_cases,
                                           implied_non_torch, main, resident_threads,
                                           rtx4090_case)
from sim.cluster import GiB
from sim.memory import (NON_TORCH_DEFAULT_BYTES, activation_peak_bytes, cublas_workspace_bytes,
                        device_traits, memory_budget, sampler_peak_bytes,
                        triton_scratch_rows)


def test_cublas_workspace_follows_pytorch_defaults():
    # CublasHandlePool.cpp parseChosenWorkspaceSize: ":4096:2:16:8", 32 MiB on 9.x/10.x/12.x
    assert cublas_workspace_bytes("8.9") == 8_519_680
    assert cublas_workspace_bytes("8.0") == 8_519_680
    assert cublas_workspace_bytes("9.0") == 32 << 20
    assert cublas_workspace_bytes("12.0") == 32 << 20


def test_triton_sampler_scratch_rows():
    """apply_top_k_top_p_triton: min(next_pow2(min(SMs, rows)), SMs) rows; the sort path
    (no scratch) below 8 rows."""
    assert triton_scratch_rows(128, 256) == 128      # RTX 4090, max_num_seqs 256
    assert triton_scratch_rows(132, 1024) == 132     # H100, vllm serve's 1024
    assert triton_scratch_rows(132, 100) == 128
    assert triton_scratch_rows(None, 100) == 100     # SM count unknown: one row a program


def test_fewer_than_8_rows_take_the_sort_path():
    """vLLM 0.19 samples fewer than 8 rows with the PyTorch sort (no Triton scratch)."""
    case = h100_cases()[0]
    m = case.model
    sort = sampler_peak_bytes(m, 7, 7, 132)
    assert sort == 7 * m.hidden_size * 2 + 7 * m.vocab_size * (2 + 30)
    assert sampler_peak_bytes(m, 8, 8, 132) < 8 / 7 * sort


def test_the_cublas_workspace_counts_once_on_every_stage():
    case = h100_cases()[0]
    h100 = device_traits("H100-SXM")
    first = activation_peak_bytes(case.model, 1, 1, 8192, 1024, h100, last_stage=False)
    last = activation_peak_bytes(case.model, 1, 1, 8192, 1024, h100)
    d = derive(case.model, "H100-SXM", 8192, 1024)
    assert first == d.forward + (32 << 20) and last == d.torch_peak


@pytest.mark.parametrize("case", h100_cases(), ids=lambda c: c.model.name)
def test_code_derived_torch_peak_reproduces_h100_vllm_0_19_logs(case):
    """vLLM prints GiB to two decimals (+-0.005); the caching allocator's block rounding
    adds up to ~1 MiB per large tensor on top of the tensors' own bytes."""
    d = derive(case.model, case.hardware, case.tokens, case.rows)
    assert d.sampler > d.forward          # the sampler run binds at 1,024 rows
    assert abs(d.torch_peak / GiB - case.logged["torch_peak"]) <= 0.006


def test_llama_weights_match_the_h100_log():
    case = h100_cases()[0]
    d = derive(case.model, case.hardware, case.tokens, case.rows)
    assert round(d.weights / GiB, 2) == case.logged["weights"] == 14.99
    lg = case.logged   # requested - weights - peak - non-torch = the logged KV memory
    assert lg["requested"] - lg["weights"] - lg["torch_peak"] - lg["non_torch"] == \
        pytest.approx(lg["kv"], abs=0.015)


def test_rtx4090_blocks_imply_the_catalogued_non_torch_term():
    case = rtx4090_case()
    if case is None:
        pytest.skip("shared validation data not available")
    d = derive(case.model, case.hardware, case.tokens, case.rows)
    # the code-derived peak on the 4090: 529.1 MiB (sampler run 256 rows + 8.125 MiB cuBLAS)
    assert d.torch_peak == 554_827_776
    lo, hi = implied_non_torch(case, d)
    # (lo, hi]: every non-torch byte count in it, and none outside, gives vLLM's 2,588
    assert blocks_with(case, d.weights, d.torch_peak, hi) == 2588
    assert blocks_with(case, d.weights, d.torch_peak, lo + 1) == 2588
    assert blocks_with(case, d.weights, d.torch_peak, lo) == 2589
    assert blocks_with(case, d.weights, d.torch_peak, hi + 1) == 2587
    # 0.60 GiB, not the 0.24-0.25 GiB of the H100 logs (the default for other devices)
    assert 0.60 * GiB < lo < hi < 0.61 * GiB
    assert not lo < NON_TORCH_DEFAULT_BYTES <= hi
    assert blocks_with(case, d.weights, d.torch_peak, NON_TORCH_DEFAULT_BYTES) == 2769
    # the catalogue's RTX 4090 entry holds a value inside the interval
    assert lo < device_traits("RTX4090").non_torch_bytes <= hi
    assert device_traits("H100-SXM").non_torch_bytes == int(0.25 * GiB)


def test_resident_threads_size_the_local_memory_reading():
    # SMs x max resident threads per SM (CUDA programming guide, per compute capability)
    assert resident_threads("RTX4090") == 128 * 1536
    assert resident_threads("H100-SXM") == 132 * 2048


def test_audit_prints_every_case_and_the_measurement_needed(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for case in h100_cases():
        assert case.name in out
    assert "DEBUG" in MEASUREMENT_NEEDED and MEASUREMENT_NEEDED in out
    assert "993 B per thread over 270,336 resident threads" in out   # H100 Llama, 0.25 GiB
    if rtx4090_case() is not None:
        assert "KV blocks: vLLM logged 2588; sim/memory.py 2588 (+0.00%)" in out
        assert "3,297 B per thread over 196,608 resident threads" in out


def test_validate_vllm_prints_the_simulated_and_logged_block_counts(capsys):
    from experiments.validate_vllm import main as validate
    from sim.paths import shared_data_root
    folder = shared_data_root() / "validation/RTX4090-Llama-3.1-8B"
    if not (folder / "vllm/meta.json").is_file():
        pytest.skip("shared validation data not available")
    assert validate([str(folder)]) == 0
    assert "KV blocks sim 2588 vs vLLM 2588 (+0.00%)" in capsys.readouterr().out


def test_h100_kv_cache_matches_vllm_0_19_log_end_to_end():
    """The whole accounting on the H100 DEBUG log's engine (Llama-3.1-8B, utilization 0.95,
    vllm serve's 8,192-token budget and 1,024 sequences): vLLM logged 58.11 GiB of KV cache,
    476,016 tokens. The old sort-based sampler term and 0.13 GiB non-torch gave about 2 GiB
    less (the sampler run binds at 1,024 rows)."""
    case = h100_cases()[0]
    inst = sim.parse_cluster({
        "num_nodes": 1, "link_bw": 16, "link_latency": 1000, "nodes": [{
            "num_instances": 1, "cpu_mem": {"mem_size": 64, "mem_bw": 50, "mem_latency": 0},
            "instances": [{"model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
                           "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0,
                                       "mem_util": case.mem_util},
                           "num_npus": 1, "tp_size": 1}]}]}).instances[0]
    b = memory_budget(inst, case.model, 16, case.tokens, case.max_num_seqs)
    assert abs(b.kv_bytes / GiB - case.logged["kv"]) < 0.02
    assert abs(b.kv_tokens - case.logged["kv_tokens"]) / case.logged["kv_tokens"] < 0.001
