"""The aiconfigurator-backed latency provider (optional dependency aiconfigurator-core)."""

from __future__ import annotations

import time

import pytest

from sim.errors import InputError
from sim.latency.base import LATENCY_PROVIDERS, BatchShape, LayerTimes
from sim.model import BLOCK_SEQUENCES, load_model

pytest.importorskip("aiconfigurator_core",
                    reason="aiconfigurator-core is not installed (pip install '.[aic]')")

import sim.latency.aic  # noqa: F401  (registers "aic")
from sim.latency.aic import AicProvider, resolve_version


def _aic_compute_ms(per_op) -> float:
    """Sum of aiconfigurator's per-op values, communication ops excluded."""
    comm = ("_ar", "_ar_1", "_ar_2", "_p2p", "_dispatch")
    return sum(v for name, v, *_ in per_op if not name.endswith(comm))


@pytest.fixture(scope="module")
def llama() -> AicProvider:
    return LATENCY_PROVIDERS.create("aic", load_model("meta-llama/Llama-3.1-8B"), "H100-SXM", 1)


@pytest.fixture(scope="module")
def qwen32() -> AicProvider:
    return LATENCY_PROVIDERS.create("aic", load_model("Qwen/Qwen3-32B"), "H100-SXM", 2,
                                    backend="vllm")


def test_builds_with_layer_names(llama, qwen32):
    for p, arch in ((llama, "llama"), (qwen32, "qwen3")):
        assert p.kind == "aic" and "h100_sxm" in p.source and "vllm" in p.source
        lt = p.layer_times(BatchShape(num_tokens=300, num_seqs=3, prefill_tokens=256,
                                      prefill_kv=512, num_decode=44, decode_kv_sum=44 * 900))
        assert isinstance(lt, LayerTimes)
        assert tuple(n for n, _ in lt.block) == BLOCK_SEQUENCES[arch]
        assert [n for n, _ in lt.prologue] == ["embedding"]
        assert [n for n, _ in lt.head] == ["final_layernorm", "lm_head", "sampler"]
        assert all(ns >= 1 for _, ns in (*lt.prologue, *lt.block, *lt.head))
        assert lt.num_blocks == p.model.num_hidden_layers


@pytest.mark.parametrize("isl", [128, 1000, 4096])
def test_prefill_agrees_with_aic_static(llama, qwen32, isl):
    for p in (llama, qwen32):
        ctx, _ = p.engine.run_static_per_op(batch_size=1, isl=isl, osl=2)
        ref = _aic_compute_ms(ctx)
        ours = p.layer_times(BatchShape(num_tokens=isl, num_seqs=1, prefill_tokens=isl))
        assert ours.total_ns() / 1e6 == pytest.approx(ref, rel=0.05)


@pytest.mark.parametrize("batch,kv", [(1, 512), (16, 2048), (128, 1024)])
def test_decode_agrees_with_aic_static(llama, qwen32, batch, kv):
    for p in (llama, qwen32):
        # aiconfigurator's first generation step of a static batch reads isl+1 tokens.
        _, gen = p.engine.run_static_per_op(batch_size=batch, isl=kv - 1, osl=2)
        ref = _aic_compute_ms(gen)
        ours = p.layer_times(BatchShape(num_tokens=batch, num_seqs=batch, num_decode=batch,
                                        decode_kv_sum=batch * kv))
        assert ours.total_ns() / 1e6 == pytest.approx(ref, rel=0.05)


def test_mixed_batch_adds_both_attentions(llama):
    pre = BatchShape(num_tokens=520, num_seqs=1, prefill_tokens=512)
    mixed = BatchShape(num_tokens=520, num_seqs=9, prefill_tokens=512, num_decode=8,
                       decode_kv_sum=8 * 4000)
    attn = dict(llama.layer_times(pre).block)["attention"]
    attn_mixed = dict(llama.layer_times(mixed).block)["attention"]
    assert attn_mixed > attn


def test_moe_model():
    p = AicProvider(load_model("Qwen/Qwen3-30B-A3B"), "H100-SXM", 1)
    lt = p.layer_times(BatchShape(num_tokens=64, num_seqs=64, num_decode=64,
                                  decode_kv_sum=64 * 1000))
    assert tuple(n for n, _ in lt.block) == BLOCK_SEQUENCES["qwen3_moe"]
    assert p.moe_ns(2048, 128) > p.moe_ns(16, 64) > 0


def test_an_expert_parallel_rank_runs_its_own_experts():
    """With EP 2 a rank holds 64 of Qwen3-30B-A3B's 128 experts and runs the tokens of
    both DP ranks routed to them; at decode-sized batches (weight-bound) that reads about
    half the expert weights the whole set needs for the same tokens."""
    model = load_model("Qwen/Qwen3-30B-A3B")
    whole = AicProvider(model, "H100-SXM", 1)
    rank = AicProvider(model, "H100-SXM", 1, ep_size=2)
    assert "ep2" in rank.source and "ep" not in whole.source.split("tp1")[1]
    for tokens in (16, 32, 64):   # a DP rank's tokens; both ranks' enter the experts
        assert rank.moe_ns(tokens) < 0.7 * whole.moe_ns(2 * tokens), tokens
    # the dense layers do not depend on the experts' placement
    shape = BatchShape(num_tokens=32, num_seqs=32, num_decode=32, decode_kv_sum=32 * 1000)
    assert dict(rank.layer_times(shape).block)["qkv_proj"] == \
        dict(whole.layer_times(shape).block)["qkv_proj"]
    with pytest.raises(InputError, match="multiple of tp"):
        AicProvider(model, "H100-SXM", 2, ep_size=3)


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B"])
def test_iteration_ns_is_the_sum_of_layer_times(model):
    """The memoised per-token-count sums give the layer list's total, on and off the
    tables (past their token and sequence range), with the same lookups noted."""
    fast = AicProvider(load_model(model), "H100-SXM", 1)
    slow = AicProvider(load_model(model), "H100-SXM", 1)
    big = fast._max_tokens + 700
    shapes = [BatchShape(num_tokens=n + c, num_seqs=n + (c > 0), prefill_tokens=c,
                         prefill_kv=3 * c, num_decode=n, decode_kv_sum=n * (500 + 37 * n))
              for n in (1, 7, 64, 255, 1100) for c in (0, 256, big)]
    for s in shapes + shapes:  # twice: memo hits too
        assert fast.iteration_ns(s) == slow.layer_times(s).total_ns()
    assert list(fast.extrapolations().items()) == list(slow.extrapolations().items())
    assert fast.extrapolations()  # the off-table shapes were noted


def test_per_iteration_calls_are_fast(llama):
    shapes = [BatchShape(num_tokens=n + c, num_seqs=n + (c > 0), prefill_tokens=c,
                         num_decode=n, decode_kv_sum=n * (500 + 37 * n))
              for n in range(1, 200) for c in (0, 256)]
    for s in shapes:  # warm the memo tables
        llama.layer_times(s)
    t0 = time.perf_counter()
    for s in shapes:
        llama.layer_times(s)
    per_call = (time.perf_counter() - t0) / len(shapes)
    assert per_call < 200e-6


def test_unknown_version_backend_hardware():
    model = load_model("meta-llama/Llama-3.1-8B")
    with pytest.raises(InputError, match=r"unknown vllm version '0\.1\.0'.*available: .*0\.24\.0"):
        LATENCY_PROVIDERS.create("aic", model, "H100-SXM", 1, backend_version="0.1.0")
    with pytest.raises(InputError, match="unknown backend.*known: sglang, trtllm, vllm"):
        LATENCY_PROVIDERS.create("aic", model, "H100-SXM", 1, backend="tgi")
    with pytest.raises(InputError, match="unknown hardware.*H100-SXM"):
        LATENCY_PROVIDERS.create("aic", model, "RTX4090", 1)
    with pytest.raises(InputError, match="tp_size=3"):
        LATENCY_PROVIDERS.create("aic", model, "H100-SXM", 3)
    assert resolve_version("h100_sxm", "vllm", None) == resolve_version("h100_sxm", "vllm",
                                                                        "current")
