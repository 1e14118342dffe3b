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
