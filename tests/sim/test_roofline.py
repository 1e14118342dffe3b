"""The roofline latency provider: physics sanity, tp scaling, and calibration fit."""

from __future__ import annotations

import csv

import pytest

from sim.latency.base import LATENCY_PROVIDERS, BatchShape, LatencyProvider
from sim.latency.catalogue import available_providers
from sim.latency.roofline import RooflineProvider, load_calibration
from sim.model import load_model
from sim.paths import shared_data_root


@pytest.fixture(scope="module")
def llama():
    return load_model("meta-llama/Llama-3.1-8B")


@pytest.fixture(scope="module")
def prov(llama):
    return LATENCY_PROVIDERS.create("roofline", llama, "H100-SXM", 1)


def decode(n, kv):
    return BatchShape(num_tokens=n, num_seqs=n, num_decode=n, decode_kv_sum=n * kv,
                      decode_kv_max=kv, decode_kv_min=kv)


def prefill(chunk, kv=0):
    return BatchShape(num_tokens=chunk, num_seqs=1, prefill_tokens=chunk, prefill_kv=kv)


def test_protocol_and_naming(prov, llama):
    assert isinstance(prov, LatencyProvider)
    assert prov.kind == "roofline" and prov.source == "roofline(H100-SXM)"
    assert prov.extrapolations() == {}
    lt = prov.layer_times(prefill(512))
    assert [n for n, _ in lt.block] == list(llama.block_sequence)
    assert [n for n, _ in lt.prologue] == ["embedding"]
    assert [n for n, _ in lt.head] == ["final_layernorm", "lm_head", "sampler"]
    assert lt.num_blocks == llama.num_hidden_layers
    assert all(isinstance(t, int) and t > 0 for _, t in (*lt.prologue, *lt.block, *lt.head))
    assert prov.iteration_ns(prefill(512)) == lt.total_ns()


def test_monotone_in_tokens_and_kv(prov):
    totals = [prov.layer_times(prefill(t)).total_ns() for t in (1, 16, 128, 512, 2048, 8192)]
    assert totals == sorted(totals) and totals[-1] > totals[0]
    kv = [prov.attention_ns(prefill(256, k)) for k in (0, 1024, 4096, 16384)]
    assert kv == sorted(kv) and kv[-1] > 2 * kv[0]
    dec = [prov.attention_ns(decode(32, k)) for k in (128, 1024, 8192, 32768)]
    assert dec == sorted(dec)


def test_decode_attention_is_memory_bound(prov):
    # Same total KV read, split differently: time follows kv_sum, not the query count.
    a = prov.attention_ns(decode(8, 8192))
    b = prov.attention_ns(decode(64, 1024))
    assert a == pytest.approx(b, rel=0.05)
    # Large reads scale linearly with kv_sum (the fixed overhead fades).
    t1, t2 = prov.attention_ns(decode(64, 8192)), prov.attention_ns(decode(64, 16384))
    assert t2 / t1 == pytest.approx(2.0, rel=0.05)


def test_tp2_roughly_halves_gemm(llama):
    p1 = RooflineProvider(llama, "H100-SXM", 1)
    p2 = RooflineProvider(llama, "H100-SXM", 2)
    for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        for tokens in (1, 4096):
            ratio = p2.dense_ns(name, tokens) / p1.dense_ns(name, tokens)
            assert 0.45 < ratio < 0.65, (name, tokens, ratio)
    assert p2.per_sequence_ns("lm_head", 64) < 0.6 * p1.per_sequence_ns("lm_head", 64)


def test_faster_hardware_is_faster(llama):
    shape = BatchShape(num_tokens=1100, num_seqs=101, prefill_tokens=1000, prefill_kv=512,
                       num_decode=100, decode_kv_sum=100 * 2000)
    t = {hw: RooflineProvider(llama, hw, 1).iteration_ns(shape)
         for hw in ("RTX4090", "A100", "H100", "B200")}
    assert t["RTX4090"] > t["A100"] > t["H100"] > t["B200"]


def test_moe(prov):
    qwen = load_model("Qwen/Qwen3-30B-A3B")
    p = RooflineProvider(qwen, "RTXPRO6000", 1)
    assert p.moe_ns(64, 64) > p.moe_ns(64, 8)           # more expert weights to read
    assert p.moe_ns(2048, 8) > p.moe_ns(64, 8)          # more tokens to compute
    assert dict(p.layer_times(decode(16, 1024)).block)["moe"] > 0
    from sim.errors import InputError
    with pytest.raises(InputError):
        prov.moe_ns(16, 8)


def test_calibration_file_is_used_and_validated(tmp_path, llama):
    cal = load_calibration()
    assert 0.2 < cal["gemm"]["eff_compute"] < 2.0
    bad = tmp_path / "cal.yaml"
    bad.write_text("classes:\n  gemm: {eff_compute: -1}\n")
    from sim.errors import InputError
    with pytest.raises(InputError, match="gemm.eff_compute"):
        RooflineProvider(llama, "H100", 1, calibration=bad)


@pytest.mark.parametrize("text,needles", [
    # a class that is no mapping: AttributeError ('float' object has no attribute 'items')
    ("classes:\n  gemm: 0.5\n", ["'classes.gemm' must be a mapping", "0.5"]),
    ("classes:\n  moe: xyz\n", ["'classes.moe' must be a mapping"]),
    # NaN / inf factors: "cannot convert float NaN to integer" in the first step
    ("classes:\n  gemm: {eff_compute: .nan}\n", ["gemm.eff_compute", "nan"]),
    ("classes:\n  lm_head: {eff_compute: .inf}\n", ["lm_head.eff_compute", "inf"]),
    ("classes:\n  sampler: {overhead_us: 1.0e+300}\n", ["sampler.overhead_us", "1e+15"]),
    # the file itself: not UTF-8 (a UnicodeDecodeError), a list, a key twice
    (b"\xff\xfe", ["not UTF-8"]),
    ("- 1\n- 2\n", ["must be a mapping", "list"]),
    ("classes:\n  gemm: {p: 2.0}\n  gemm: {p: 3.0}\n", ["'gemm' appears twice"]),
], ids=["class-a-number", "class-a-string", "factor-nan", "factor-inf", "factor-1e300",
        "not-utf8", "a-list", "key-twice"])
def test_calibration_file_refused(tmp_path, llama, text, needles):
    from sim.errors import InputError

    bad = tmp_path / "cal.yaml"
    if isinstance(text, bytes):
        bad.write_bytes(text)
    else:
        bad.write_text(text)
    with pytest.raises(InputError) as exc:
        RooflineProvider(llama, "H100", 1, calibration=bad)
    msg = str(exc.value)
    assert "\n" not in msg and str(bad) in msg, msg
    for n in needles:
        assert n in msg, (n, msg)


def test_catalogue_lists_roofline_for_known_hardware(tmp_path):
    names = [p["provider"] for p in available_providers("H200", "meta-llama/Llama-3.1-8B", 1)]
    assert "roofline" in names and "measured" not in names
    names = [p["provider"] for p in available_providers("NoSuchGPU", "meta-llama/Llama-3.1-8B", 1)]
    assert "roofline" not in names and "measured" not in names
    # a bundle folder (meta.yaml + tp folder) in an extra search dir is found, and listed
    # first: the order is auto's (measured > aic > roofline, #17)
    variant = tmp_path / "H200" / "meta-llama" / "Llama-3.1-8B" / "bf16"
    (variant / "tp2").mkdir(parents=True)
    (variant / "meta.yaml").write_text("{}\n")
    found = available_providers("H200", "meta-llama/Llama-3.1-8B", 2, [tmp_path])
    assert [p["provider"] for p in found][0] == "measured" and "roofline" in str(found)
    assert found[0]["source"].startswith(str(tmp_path))


BUNDLE = shared_data_root() / "profiles" / "RTX4090" / "meta-llama" / "Llama-3.1-8B" / "bf16"


@pytest.mark.shared
@pytest.mark.skipif(not (BUNDLE / "tp1" / "dense.csv").is_file(),
                    reason=f"shared measured bundle not found at {BUNDLE}")
def test_calibrated_gemms_match_rtx4090_at_large_tokens(llama):
    """Calibrated dense GEMMs within 20% of measured at >= 1024 tokens on the RTX 4090."""
    prov = RooflineProvider(llama, "RTX4090", 1)
    errs = []
    with (BUNDLE / "tp1" / "dense.csv").open() as fh:
        for row in csv.DictReader(fh):
            if row["layer"] in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj") \
                    and int(row["tokens"]) >= 1024:
                meas = float(row["time_us"]) * 1e3
                errs.append(prov.dense_ns(row["layer"], int(row["tokens"])) / meas - 1)
    assert len(errs) > 50
    assert max(abs(e) for e in errs) < 0.20
    assert sum(abs(e) for e in errs) / len(errs) < 0.12


@pytest.mark.shared
@pytest.mark.skipif(not (BUNDLE / "tp1" / "dense.csv").is_file(),
                    reason=f"shared measured bundle not found at {BUNDLE}")
def test_catalogue_finds_measured_bundle():
    names = [p["provider"] for p in available_providers("RTX4090", "meta-llama/Llama-3.1-8B", 1)]
    assert names == ["measured", "roofline"]   # auto's order; no aic database for the 4090
    assert "measured" not in [p["provider"] for p in
                              available_providers("RTX4090", "meta-llama/Llama-3.1-8B", 2)]
