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
