"""experiments/vllm_memory_audit.py: vLLM 0.19's memory terms derived from its code paths,
checked against vLLM 0.19.0 start-up logs (H100) and the RTX 4090 validation run's block
count; experiments/validate_vllm.py reports the simulated block count next to vLLM's."""

from __future__ import annotations

import pytest

from experiments.vllm_memory_audit import (MEASUREMENT_NEEDED, blocks_with, cublas_workspace_bytes,
                                           derive, h100_cases, implied_non_torch, main,
                                           resident_threads, rtx4090_case, triton_scratch_rows)
from sim.cluster import GiB
from sim.memory import NON_TORCH_BASE_BYTES


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
    assert triton_scratch_rows(132, 7) == 0


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


def test_rtx4090_blocks_imply_a_non_torch_term_no_constant_gives():
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
    # 0.60 GiB: neither sim/memory.py's 0.13 GiB nor the 0.24-0.25 GiB of the H100 logs
    assert 0.60 * GiB < lo < hi < 0.61 * GiB
    assert not lo < NON_TORCH_BASE_BYTES <= hi and not lo < 0.25 * GiB <= hi
    assert blocks_with(case, d.weights, d.torch_peak, int(0.25 * GiB)) == 2769


def test_switching_the_sampler_term_alone_leaves_the_4090_count_outside_1_percent():
    """vLLM 0.19's Triton sampler peak with sim/memory.py's non-torch constant: 2,831
    blocks, +9.4% against the 2,588 logged, so sim/memory.py keeps the <= 0.16 sampler term
    (with which the two known-off terms give 2,586) until the non-torch term is measured."""
    case = rtx4090_case()
    if case is None:
        pytest.skip("shared validation data not available")
    d = derive(case.model, case.hardware, case.tokens, case.rows)
    switched = blocks_with(case, d.weights, d.torch_peak, NON_TORCH_BASE_BYTES)
    assert switched == 2831
    assert abs(switched - case.logged_blocks) / case.logged_blocks > 0.01


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
        assert "KV blocks: vLLM logged 2588; sim/memory.py 2586" in out
        assert "0.19's alone: 2831 blocks, outside 1%" in out
        assert "3,297 B per thread over 196,608 resident threads" in out


def test_validate_vllm_prints_the_simulated_and_logged_block_counts(capsys):
    from experiments.validate_vllm import main as validate
    from sim.paths import shared_data_root
    folder = shared_data_root() / "validation/RTX4090-Llama-3.1-8B"
    if not (folder / "vllm/meta.json").is_file():
        pytest.skip("shared validation data not available")
    assert validate([str(folder)]) == 0
    assert "KV blocks sim 2586 vs vLLM 2588 (-0.08%)" in capsys.readouterr().out
