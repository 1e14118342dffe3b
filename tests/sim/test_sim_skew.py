"""Skew correction: batches whose decode KV lengths differ cost more than a uniform batch
at the mean, by the bundle's measured per-bucket alpha."""

from __future__ import annotations

import yaml
from sim_testkit import HW, MODEL, make_bundle

from sim.latency.base import BatchShape
from sim.latency.measured import MeasuredProvider
from sim.model import load_model

AXES = {"n_bins": [0, 2, 4, 8, 16, 32, 64, 128, 256, 1000000],
        "n_labels": ["n<=2", "n<=4", "n<=8", "n<=16", "n<=32", "n<=64", "n<=128", "n<=256", "n>256"],
        "skew_rate_bins": [-0.01, 0.05, 0.15, 0.4, 0.7, 1.01],
        "skew_rate_labels": ["sr<=5%", "sr<=15%", "sr<=40%", "sr<=70%", "sr>70%"],
        "kv_big_bins": [0, 1024, 4096, 16384, 1000000000],
        "kv_big_labels": ["kvB<=1k", "kvB<=4k", "kvB<=16k", "kvB>16k"],
        "kp_bins": [-1, 0, 2048, 1000000000], "kp_labels": ["kp=0", "kp<=2k", "kp>2k"]}


def _provider(tmp_path, with_fit: bool) -> MeasuredProvider:
    variant = make_bundle(tmp_path)
    if with_fit:
        meta = yaml.safe_load((variant / "meta.yaml").read_text())
        meta["skew_fit"] = {"enabled": True, "bucket_axes": AXES, "per_tp": {
            1: {"alpha_default": 0.05, "bucket_table": "tp1/skew_fit.csv"}}}
        (variant / "meta.yaml").write_text(yaml.safe_dump(meta))
        (variant / "tp1" / "skew_fit.csv").write_text(
            "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples\n"
            "0,n<=8,sr<=40%,kvB<=4k,kp=0,0.5,3\n")
    return MeasuredProvider(load_model(MODEL), HW, 1, bundle=variant)


def test_uniform_batches_are_uncorrected_and_skewed_ones_use_the_bucket_alpha(tmp_path):
    fit = _provider(tmp_path / "a", True)
    plain = _provider(tmp_path / "b", False)
    uniform = BatchShape(8, 8, 0, 0, 8, 8 * 1000, 1000, 1000)
    assert fit.attention_ns(uniform) == plain.attention_ns(uniform)
    # 8 decodes, mean 1000, longest 3000, shortest 100: skew rate 0.31 -> sr<=40%, kvB<=4k
    skewed = BatchShape(8, 8, 0, 0, 8, 8 * 1000, 3000, 100)
    t_mean = plain.attention_ns(skewed)
    t_max = plain.attention_ns(BatchShape(8, 8, 0, 0, 8, 8 * 3000, 3000, 3000))
    assert fit.attention_ns(skewed) == t_mean + 0.5 * (t_max - t_mean)
    # another bucket falls back to the pooled alpha
    other = BatchShape(32, 32, 0, 0, 32, 32 * 1000, 3000, 100)
    t_mean = plain.attention_ns(other)
    t_max = plain.attention_ns(BatchShape(32, 32, 0, 0, 32, 32 * 3000, 3000, 3000))
    assert fit.attention_ns(other) == t_mean + 0.05 * (t_max - t_mean)


def test_skew_rate_matches_the_two_point_batch_of_the_same_mean_variance_and_max(tmp_path):
    # The skew profile measures two-point batches (a share p at the longest KV, the rest at
    # one shorter length), whose skew rate (mean - min) / (max - min) is p. A served batch
    # spreads between its shortest and longest: its rate is that of the two-point batch
    # with the same mean, variance and longest KV, p = var / (var + (max - mean)^2), not
    # (mean - min) / (max - min), which reads a uniform spread as half the batch long.
    from sim.latency.measured import skew_rate
    two_point = [100] * 6 + [3000] * 2                  # p = 0.25
    spread = list(range(100, 3001, 100))                # uniform 100..3000
    def shape(kvs, sq=True):
        return BatchShape(len(kvs), len(kvs), 0, 0, len(kvs), sum(kvs), max(kvs), min(kvs), 0,
                          sum(k * k for k in kvs) if sq else 0)
    assert skew_rate(shape(two_point), 0) == 0.25
    assert skew_rate(shape(two_point, sq=False), sum(two_point) // 8) == 0.25
    mean = sum(spread) / len(spread)
    var = sum((k - mean) ** 2 for k in spread) / len(spread)
    p = var / (var + (3000 - mean) ** 2)
    assert abs(skew_rate(shape(spread), int(mean)) - p) < 1e-12
    assert 0.25 < p < 0.27                               # sr<=40%, not sr<=70% (0.5)
    fit = _provider(tmp_path / "a", True)
    plain = _provider(tmp_path / "b", False)
    eight = [100, 500, 900, 1300, 1700, 2100, 2500, 2900]  # uniform: p ~0.27, sr<=40%
    s = shape(eight)
    t_mean = plain.attention_ns(s)
    t_max = plain.attention_ns(BatchShape(8, 8, 0, 0, 8, 8 * 2900, 2900, 2900))
    assert fit.attention_ns(s) == t_mean + 0.5 * (t_max - t_mean)
    # read from min and max alone (rate 0.5, sr<=70%) it falls to the pooled alpha
    assert fit.attention_ns(shape(eight, sq=False)) == t_mean + 0.05 * (t_max - t_mean)
