"""The measured provider's lookups: exact at grid points, linear between them, linear
extrapolation above the grid (counted), clamped below, and errors for missing data."""

from __future__ import annotations

import pytest
from sim_testkit import (
    ATTN_KD,
    ATTN_KP,
    ATTN_ND,
    ATTN_PC,
    HW,
    MODEL,
    attn_us,
    flat_workload,
    make_bundle,
    make_cluster,
    opts_for,
)

import sim
from sim.errors import InputError
from sim.latency.base import BatchShape
from sim.latency.measured import MeasuredProvider, find_bundle
from sim.model import load_model


def quad(t):  # a convex dense curve: interpolation and extrapolation differ from the truth
    return 5.0 + 0.0001 * t * t


def quad_seq(s):
    return 3.0 + 0.001 * s * s


def quad_attn(pc, kp, nd, kd):
    return 1.0 + 1e-6 * pc * pc + 1e-7 * kp * kp + 0.001 * nd * nd + 1e-6 * kd * kd


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL)


@pytest.fixture(scope="module")
def quad_provider(tmp_path_factory, model):
    root = tmp_path_factory.mktemp("quad")
    variant = make_bundle(root, dense_fn=quad, seq_fn=quad_seq, attn_fn=quad_attn)
    return MeasuredProvider(model, HW, 1, bundle=variant)


@pytest.fixture
def lin_provider(bundle_root, model):
    return MeasuredProvider(model, HW, 1, profiles_dirs=(str(bundle_root),))


def dense(p, layer, t):
    return p._dense_at(layer, t)


def test_bundle_is_found_in_profiles_dirs(bundle_root, model):
    found = find_bundle(HW, model, (str(bundle_root),))
    assert found == bundle_root / HW / MODEL / "bf16"
    assert find_bundle("NO_SUCH_HW", model, (str(bundle_root),)) is None


@pytest.mark.parametrize("t", [1, 16, 64, 256, 1024, 2048])
def test_dense_exact_at_grid_points(quad_provider, t):
    assert dense(quad_provider, "qkv_proj", t) == pytest.approx(quad(t) * 1e3)
    assert quad_provider.extrapolations() == {}


@pytest.mark.parametrize("lo, hi", [(16, 64), (256, 1024), (1024, 2048)])
def test_dense_linear_between_grid_points(quad_provider, lo, hi):
    for frac in (0.25, 0.5, 0.75):
        t = int(lo + frac * (hi - lo))
        f = (t - lo) / (hi - lo)
        expect = (quad(lo) + f * (quad(hi) - quad(lo))) * 1e3
        assert dense(quad_provider, "down_proj", t) == pytest.approx(expect)
        assert expect > quad(t) * 1e3  # convex: the chord lies above the curve


def test_dense_below_grid_is_clamped(quad_provider):
    assert dense(quad_provider, "embedding", 0) == pytest.approx(quad(1) * 1e3)


def test_dense_above_grid_extrapolates_and_is_counted(tmp_path, model):
    variant = make_bundle(tmp_path, dense_fn=quad, seq_fn=quad_seq, attn_fn=quad_attn)
    p = MeasuredProvider(model, HW, 1, bundle=variant)
    slope = (quad(2048) - quad(1024)) / 1024
    t = 3000
    expect = (quad(2048) + slope * (t - 2048)) * 1e3
    assert dense(p, "gate_up_proj", t) == pytest.approx(expect)
    assert p.extrapolations() == {}  # the raw table lookup is not the counting point
    lt = p.layer_times(BatchShape(t, 1, t, 0))
    assert dict(lt.block)["gate_up_proj"] == int(expect)
    assert p.extrapolations().get("tokens", 0) >= 1
    # beyond the precomputed table too (max_tokens=16384 by default)
    t2 = 20000
    assert dense(p, "gate_up_proj", t2) == pytest.approx((quad(2048) + slope * (t2 - 2048)) * 1e3,
                                                         rel=1e-6)


def test_per_sequence_interpolation_and_extrapolation(tmp_path, model):
    variant = make_bundle(tmp_path, dense_fn=quad, seq_fn=quad_seq, attn_fn=quad_attn)
    p = MeasuredProvider(model, HW, 1, bundle=variant)
    assert p._seq_at("lm_head", 16) == pytest.approx(quad_seq(16) * 1e3)
    mid = p._seq_at("sampler", 10)
    assert mid == pytest.approx((quad_seq(4) + 0.5 * (quad_seq(16) - quad_seq(4))) * 1e3)
    lt = p.layer_times(BatchShape(300, 300, 0, 0, 300, 300 * 100, 100, 100))
    slope = (quad_seq(256) - quad_seq(64)) / 192
    assert dict(lt.head)["lm_head"] == int((quad_seq(256) + slope * 44) * 1e3)
    ex = p.extrapolations()
    assert ex.get("sequences", 0) >= 1 and ex.get("n_decode", 0) >= 1


@pytest.mark.parametrize("pc", ATTN_PC)
@pytest.mark.parametrize("nd", ATTN_ND)
def test_attention_exact_at_grid_points(quad_provider, pc, nd):
    for kp in ATTN_KP:
        for kd in ATTN_KD:
            if nd == 0 and kd:
                continue  # the shape has no decode KV without decodes
            shape = BatchShape(pc + nd, 1 + nd, pc, kp, nd, kd * nd, kd, kd)
            assert quad_provider.attention_ns(shape) == pytest.approx(quad_attn(pc, kp, nd, kd) * 1e3)


def test_attention_multilinear_inside_grid(lin_provider):
    """The default bundle's attention time is multilinear, so interpolation is exact."""
    for pc, kp, nd, kd in [(100, 500, 5, 300), (1000, 4000, 100, 5000), (2047, 8000, 255, 8191),
                           (256, 1024, 16, 1024), (0, 0, 200, 7000)]:
        shape = BatchShape(pc + nd, 1 + nd, pc, kp, nd, kd * nd, kd, kd)
        assert lin_provider.attention_ns(shape) == pytest.approx(attn_us(pc, kp, nd, kd) * 1e3,
                                                                 rel=1e-9)
    assert lin_provider.extrapolations() == {}


def test_attention_midpoint_is_average_of_neighbours(quad_provider):
    # halfway along kv_prefill between 1024 and 8192, other axes on the grid
    shape = BatchShape(256, 1, 256, (1024 + 8192) // 2, 0, 0, 0, 0)
    expect = (quad_attn(256, 1024, 0, 0) + quad_attn(256, 8192, 0, 0)) / 2 * 1e3
    assert quad_provider.attention_ns(shape) == pytest.approx(expect)
    # halfway along n_decode between 16 and 256 at kv_decode 1024
    nd = 136
    shape = BatchShape(nd, nd, 0, 0, nd, 1024 * nd, 1024, 1024)
    expect = (quad_attn(0, 0, 16, 1024) + quad_attn(0, 0, 256, 1024)) / 2 * 1e3
    assert quad_provider.attention_ns(shape) == pytest.approx(expect)


@pytest.mark.parametrize("axis, shape", [
    ("prefill_chunk", BatchShape(3000, 1, 3000, 0)),
    ("kv_prefill", BatchShape(100, 1, 100, 10000)),
    ("n_decode", BatchShape(300, 300, 0, 0, 300, 300 * 100, 100, 100)),
    ("kv_decode", BatchShape(4, 4, 0, 0, 4, 4 * 9000, 9000, 9000)),
])
def test_attention_above_grid_extrapolates_and_is_counted(tmp_path, model, axis, shape):
    variant = make_bundle(tmp_path, dense_fn=quad, seq_fn=quad_seq, attn_fn=quad_attn)
    p = MeasuredProvider(model, HW, 1, bundle=variant)
    v = p.attention_ns(shape)
    assert p.extrapolations().get(axis, 0) >= 1
    if axis == "prefill_chunk":
        # 3,000 / 2,048 pieces of the top chunk, each over (3,000 - 2,048) / 2 = 476 more
        # cached tokens on average (the causal rows before it), kv_prefill interpolated
        # between its grid points 0 and 1,024
        kp = (3000 - 2048) // 2
        at_top = quad_attn(2048, 0, 0, 0) + kp / 1024 * (quad_attn(2048, 1024, 0, 0)
                                                          - quad_attn(2048, 0, 0, 0))
        assert v == pytest.approx(3000 / 2048 * at_top * 1e3)
    if axis == "kv_decode":
        def along_kd(nd):  # linear extrapolation from kv_decode 1024 and 8192
            a, b = quad_attn(0, 0, nd, 1024), quad_attn(0, 0, nd, 8192)
            return b + (b - a) / (8192 - 1024) * (9000 - 8192)
        at0, at16 = along_kd(0), along_kd(16)  # n_decode=4 lies between 0 and 16
        assert v == pytest.approx((at0 + 4 / 16 * (at16 - at0)) * 1e3)


def test_iteration_ns_matches_layer_sum(lin_provider, model):
    for shape in [BatchShape(1, 1, 0, 0, 1, 500, 500, 500), BatchShape(600, 3, 598, 100, 2, 40, 30, 10),
                  BatchShape(2048, 1, 2048, 0)]:
        total = lin_provider.layer_times(shape).total_ns()
        # the fast path sums in float then truncates once; layer_times truncates per layer
        assert lin_provider.iteration_ns(shape) == pytest.approx(total, abs=2 * 12 * 32)


@pytest.mark.parametrize("layer", ["o_proj", "embedding", "final_layernorm"])
def test_missing_dense_layer_names_layer_and_file(tmp_path, model, layer):
    variant = make_bundle(tmp_path, omit_dense_layer=layer)
    with pytest.raises(InputError) as ei:
        MeasuredProvider(model, HW, 1, bundle=variant)
    msg = str(ei.value)
    assert f"missing layer {layer!r}" in msg
    assert str(variant / "tp1" / "dense.csv") in msg


def test_missing_per_sequence_layer_names_layer_and_file(tmp_path, model):
    variant = make_bundle(tmp_path, omit_seq_layer="sampler")
    with pytest.raises(InputError) as ei:
        MeasuredProvider(model, HW, 1, bundle=variant)
    assert "'sampler'" in str(ei.value) and "per_sequence.csv" in str(ei.value)


def test_non_numeric_cell_names_file_line_and_column(tmp_path, model):
    variant = make_bundle(tmp_path)
    p = variant / "tp1" / "dense.csv"
    lines = p.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",fast"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"dense\.csv: line 4: column 'time_us'"):
        MeasuredProvider(model, HW, 1, bundle=variant)


def test_missing_tp_folder_is_an_error(tmp_path, model):
    variant = make_bundle(tmp_path)
    with pytest.raises(InputError, match=r"no tp2 folder"):
        MeasuredProvider(model, HW, 2, bundle=variant)


def test_no_bundle_error_lists_searched_folders(tmp_path, model):
    with pytest.raises(InputError) as ei:
        MeasuredProvider(model, "NO_SUCH_HW", 1, profiles_dirs=(str(tmp_path),))
    assert "NO_SUCH_HW" in str(ei.value) and str(tmp_path) in str(ei.value)


def test_extrapolations_reported_in_summary(bundle_root):
    small = sim.simulate(make_cluster(400), flat_workload([(0, 500, 3)]), opts_for(bundle_root))
    assert small.summary["latency_extrapolations"] == {}
    big = sim.simulate(make_cluster(400), flat_workload([(0, 4000, 3)]),
                       opts_for(bundle_root, max_num_batched_tokens=4096))
    ex = big.summary["latency_extrapolations"]
    assert ex.get("tokens", 0) >= 1 and ex.get("prefill_chunk", 0) >= 1
