"""How each latency provider lays out an MoE layer's experts on one rank, as vLLM 0.19 does
(``FusedMoEParallelConfig.make``):

- without expert parallelism, every rank of a TP group holds every expert with its
  intermediate dimension sharded over the tp ranks, and runs all the tokens through
  them: per rank, 1/tp of the weights and of the FLOPs;
- with it, each rank holds num_experts / ep whole experts (no TP sharding inside an
  expert) and runs the token-expert assignments routed to them.

``moe_ns(tokens, activated)`` is one rank's MoE layer in its instance's layout, ``tokens``
x top_k being the assignments that rank runs. Before, the roofline and aic providers
divided an EP rank's expert work by tp a second time (a TP2 x EP2 instance's experts ran
at half the cost of the same instance without EP), and the measured provider read the
bundle's whole-expert tp1 table for a TP-sharded tp2 rank (twice the cost).
"""

from __future__ import annotations

import pytest

from sim.latency.base import load_providers
from sim.model import load_model
from sim.paths import shared_data_root

MODEL = "Qwen/Qwen3-30B-A3B"


def _has_aic() -> bool:
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        return False
    return True


def _has_bundle() -> bool:
    return (shared_data_root() / "profiles/RTXPRO6000/Qwen").is_dir()


PROVIDERS = [
    pytest.param("roofline", "H100-SXM", id="roofline"),
    pytest.param("aic", "H100-SXM", id="aic",
                 marks=pytest.mark.skipif(not _has_aic(), reason="aiconfigurator-core absent")),
    pytest.param("measured", "RTXPRO6000", id="measured",
                 marks=pytest.mark.skipif(not _has_bundle(), reason="no shared profiles")),
]


def _provider(kind: str, hardware: str, tp: int, ep: int = 1):
    return load_providers().create(kind, load_model(MODEL), hardware, tp, ep_size=ep)


@pytest.mark.parametrize("kind,hardware", PROVIDERS)
def test_an_expert_parallel_rank_runs_whole_experts(kind, hardware):
    """A TP2 x EP2 rank holds 64 whole experts, as a rank of a TP1 x DP2 x EP2 group does:
    the same assignments cost the same whatever the attention's TP degree; where the
    provider takes the activated experts (aiconfigurator routes by its own model), also
    what they cost on a TP1 rank holding every expert."""
    ep_tp1 = _provider(kind, hardware, 1, ep=2)
    ep_tp2 = _provider(kind, hardware, 2, ep=2)
    one = _provider(kind, hardware, 1)
    for tokens, active in ((16, 48), (64, 64), (256, 64), (1024, 64)):
        ratio = ep_tp2.moe_ns(tokens, active) / ep_tp1.moe_ns(tokens, active)
        assert 0.97 < ratio < 1.03, (tokens, ratio)
        if kind != "aic":
            assert ep_tp2.moe_ns(tokens, active) == one.moe_ns(tokens, active)


@pytest.mark.parametrize("kind,hardware", PROVIDERS)
def test_a_tensor_parallel_rank_runs_a_1_over_tp_shard_of_every_expert(kind, hardware):
    one = _provider(kind, hardware, 1)
    tp2 = _provider(kind, hardware, 2)
    for tokens in (16, 64, 256, 1024):
        active = one.expected_active_experts(tokens)
        ratio = tp2.moe_ns(tokens, active) / one.moe_ns(tokens, active)
        assert 0.4 < ratio < 0.65, (tokens, ratio)


@pytest.mark.parametrize("kind,hardware", PROVIDERS)
def test_expert_parallelism_inside_a_tp_group_moves_work_without_removing_it(kind, hardware):
    """TP2 with and without --enable-expert-parallel: per rank the same expert FLOPs and
    weight bytes (whole experts for half the assignments, or half of every expert for all
    of them), so the replay's speed barely moves; before, EP's roofline TPOT was 36% lower."""
    from experiments.moe_expert_layout import layout_replay

    tp = layout_replay(kind, hardware, MODEL, 2, 1)
    ep = layout_replay(kind, hardware, MODEL, 2, 2)
    for metric in ("tpot_ms", "ttft_ms"):
        ratio = ep[metric]["mean"] / tp[metric]["mean"]
        assert 0.85 < ratio < 1.2, (metric, ratio)
