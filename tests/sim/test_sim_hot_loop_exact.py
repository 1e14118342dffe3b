"""The hot loop's fast paths against the step-by-step reference, on the digest harness.

``experiments/sim_digest.py`` hashes every output a user gets (per-request CSV, summary,
time series) over ~140 scenarios; here a sample of them (the validation replay under
tight and loose KV pools, the trace with a CPU prefix tier and priority scheduling,
random workloads over every scheduling option, PD, PP, TP, DP/EP MoE and power) is
simulated with event leaping on and off, and both must hash the same.
"""

from __future__ import annotations

import pytest

from experiments.sim_digest import _run_digest, scenarios
from sim.paths import shared_data_root

SAMPLE = ("rtx_replay_async1_blocksNone_cache1", "rtx_replay_async0_blocks400_cache1",
          "rtx_replay_async1_blocks900_cache0", "rtx_trace_speed3.0_tierCPU_priority",
          "rtx_trace_two_instances_tier_shared", "random03_", "random05_", "random16_",
          "random20_", "random21_", "random25_", "random33_", "random46_", "random55_",
          "sys_pd_async1_seed1", "sys_pp2_async0_seed2", "sys_tp2_power_async1_seed1",
          "sys_moe_dp_ep_async1_seed1", "sys_moe_single_async0_seed2")

CASES = {name: make for name, make in scenarios() if name.startswith(SAMPLE)}


def test_sample_covers_every_prefix():
    assert all(any(n.startswith(p) for n in CASES) for p in SAMPLE)


@pytest.mark.skipif(not (shared_data_root() / "validation").is_dir(), reason="no validation data")
@pytest.mark.parametrize("name", sorted(CASES))
def test_leaping_hashes_like_stepping(name):
    cluster, wl, opts = CASES[name]()
    leapt = _run_digest(cluster, wl, opts.replace(event_leaping=True))
    stepped = _run_digest(cluster, wl, opts.replace(event_leaping=False))
    assert leapt == stepped


def test_line_many_is_line_at_each_point():
    """The measured provider's walked-bracket line over a range of decode KVs gives
    ``grid.line``'s float at every point (below, inside, at and past the grid; the grid's keys
    are token counts, integers as the bundle is parsed)."""
    import random

    from sim.latency.grid import Axis, line
    from sim.latency.measured import MeasuredProvider

    rng = random.Random(3)
    for _ in range(2000):
        n = rng.randint(1, 6)
        keys = sorted(rng.sample(range(20000), n))
        axis = Axis(keys)
        vals = [rng.uniform(0, 1e5) for _ in range(axis.n)]
        slope = rng.uniform(0, 3)
        start = rng.choice([-50, 0, int(keys[0]), int(keys[-1]) - 3, rng.randint(0, 21000)])
        qs = range(start, start + rng.randint(0, 400))
        got = MeasuredProvider._line_many(axis, vals, qs, slope)
        want = [line(axis, vals, q, slope) for q in qs]
        assert [x.hex() for x in map(float, got)] == [x.hex() for x in map(float, want)]
