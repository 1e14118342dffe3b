"""The measured provider beyond its grid (issue #14 item 1): extrapolation is fitted on the
upper part of each axis and never makes more work cheaper, and the lookups that leave the
grid are counted in the run summary."""

from __future__ import annotations

import pytest

import sim
from sim.latency.base import BatchShape
from sim.latency.measured import MeasuredProvider, upper_slope, work_slope
from sim.model import load_model
from sim_testkit import (ATTN_KD, ATTN_KP, ATTN_ND, ATTN_PC, DENSE_TOKENS, HW, MODEL,
                            attn_us, dense_us, flat_workload, make_bundle, make_cluster,
                            opts_for)

SEQ_TOP = 256


def flat_top_dense(tokens: float) -> float:
    """Linear up to 1024 tokens, then a last step that gets slightly cheaper (the wave
    quantisation plateau that fooled the last-two-points rule)."""
    return dense_us(tokens) if tokens <= 1024 else dense_us(1024) - 0.01


def flat_top_seq(seqs: float) -> float:
    """Superlinear in sequences (as vLLM's sampler), but the last step flattens."""
    return 2.0 + 0.05 * seqs if seqs < SEQ_TOP else 2.0 + 0.05 * 64 + 0.001


def dipping_attention(pc, kp, nd, kd):
    """Grows along every axis except at each axis's top point, which costs a little less
    than the point below it (a measurement plateau, or noise)."""
    dips = 0
    q = [pc, kp, nd, kd]
    for i, grid in enumerate((ATTN_PC, ATTN_KP, ATTN_ND, ATTN_KD)):
        if q[i] == grid[-1]:
            q[i] = grid[-2]
            dips += 1
    return attn_us(*q) - 0.5 * dips


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    root = tmp_path_factory.mktemp("flat")
    make_bundle(root, dense_fn=flat_top_dense, seq_fn=flat_top_seq, attn_fn=dipping_attention)
    return MeasuredProvider(load_model(MODEL), HW, 1, profiles_dirs=(str(root),),
                            max_tokens=4096, max_seqs=512)


def test_upper_slope_is_a_fit_on_the_upper_half_floored_at_zero():
    assert upper_slope([1, 2, 4, 8], [1, 2, 4, 8]) == pytest.approx(1.0)
    assert upper_slope([1, 2, 4, 8], [1, 2, 9, 8]) == 0.0  # falling top: no negative slope
    assert work_slope([1024, 2048], [100.0, 100.0]) == pytest.approx(100.0 / 2048)


def test_dense_beyond_grid_scales_with_work_and_never_falls(provider):
    top = DENSE_TOKENS[-1]
    at_top = provider._dense_at("o_proj", top)
    prev = at_top
    for tokens in range(top, 5 * top, 97):  # inside the table and past its end
        v = provider._dense_at("o_proj", tokens)
        assert v >= prev - 1e-9, tokens
        prev = v
    # 4x the tokens costs at least 4x (time per token of the largest measured step)
    assert provider._dense_at("o_proj", 4 * top) >= 4 * at_top - 1e-6


def test_per_sequence_beyond_grid_is_not_underestimated(provider):
    at_top = provider._seq_at("sampler", SEQ_TOP)
    assert provider._seq_at("sampler", 2 * SEQ_TOP) >= 2 * at_top - 1e-6
    values = [provider._seq_at("sampler", s) for s in range(SEQ_TOP, 4 * SEQ_TOP, 31)]
    assert values == sorted(values)


@pytest.mark.parametrize("axis", ["prefill_chunk", "kv_prefill", "n_decode", "kv_decode"])
def test_attention_beyond_grid_never_falls(provider, axis):
    tops = {"prefill_chunk": ATTN_PC[-1], "kv_prefill": ATTN_KP[-1], "n_decode": ATTN_ND[-1],
            "kv_decode": ATTN_KD[-1]}
    base = {"prefill_chunk": 256, "kv_prefill": 1024, "n_decode": 16, "kv_decode": 1024}
    values = []
    for scale in (1.0, 1.25, 1.5, 2.0, 3.0, 4.0):
        q = dict(base, **{axis: int(tops[axis] * scale)})
        nd = q["n_decode"]
        shape = BatchShape(num_tokens=q["prefill_chunk"] + nd, num_seqs=nd + 1,
                           prefill_tokens=q["prefill_chunk"], prefill_kv=q["kv_prefill"],
                           num_decode=nd, decode_kv_sum=nd * q["kv_decode"],
                           decode_kv_max=q["kv_decode"], decode_kv_min=q["kv_decode"])
        values.append(provider.attention_ns(shape))
    assert values == sorted(values), values
    assert provider.extrapolations().get(axis, 0) > 0


def test_summary_counts_lookups_off_the_grid(bundle_root):
    """A 3,000-token prompt with the budget at 4,096 runs a step beyond the 2,048-token
    grid: the summary says so, and how many lookups left the grid in all."""
    w = flat_workload([(0, 3000, 2)])
    r = sim.simulate(make_cluster(400), w, opts_for(bundle_root, max_num_batched_tokens=4096))
    ex = r.summary["latency_extrapolations"]
    assert ex.get("tokens", 0) > 0
    assert r.summary["latency_off_grid_lookups"] == sum(ex.values())
    inside = sim.simulate(make_cluster(400), flat_workload([(0, 1000, 2)]), opts_for(bundle_root))
    assert inside.summary["latency_off_grid_lookups"] == 0


def test_prefill_beyond_the_chunk_grid_grows_with_its_causal_work():
    """A prompt chunk above the measured grid (2,048 tokens in the shared bundles; vLLM
    serve's default budget is 8,192 on cards of 70 GiB and more) costs its causal
    attention work, which grows with the square of the chunk: read as pieces of the top
    measured chunk over the rows before them. Before, the chunk axis was extended as a
    line: one fresh 8,192-token prompt cost 5.1x a 2,048-token one on the RTX 4090 bundle
    (work 16x; in the grid, 1,024 -> 2,048 tokens already costs 3.1x)."""
    from sim.paths import shared_data_root

    root = shared_data_root() / "profiles"
    if not (root / "RTX4090").is_dir():
        pytest.skip("no shared profiles")
    p = MeasuredProvider(load_model("meta-llama/Llama-3.1-8B"), "RTX4090", 1)

    def attn(chunk, kv=0, nd=0):
        return p.attention_ns(BatchShape(num_tokens=chunk + nd, num_seqs=1 + nd,
                                         prefill_tokens=chunk, prefill_kv=kv, num_decode=nd,
                                         decode_kv_sum=nd * 1024, decode_kv_max=1024 if nd else 0,
                                         decode_kv_min=1024 if nd else 0))

    top = attn(2048)
    assert 3.0 < attn(4096) / top < 4.2
    assert 12.0 < attn(8192) / top < 16.5
    # over a cached prefix the work grows less than the square: 4,096 over 8,192 cached
    # tokens is 2.2x the work of 2,048 over the same prefix
    assert 1.9 < attn(4096, 8192) / attn(2048, 8192) < 2.5
    # decodes beside the chunk are charged once, not once per piece
    extra_2k = attn(2048, nd=64) - top
    extra_8k = attn(8192, nd=64) - attn(8192)
    assert extra_8k < 3 * extra_2k
    assert p.extrapolations()["prefill_chunk"] > 0
