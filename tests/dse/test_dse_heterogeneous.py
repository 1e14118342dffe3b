"""A search over a hardware menu that mixes an NPU with and without PIM runs end to end,
with the PIM knobs applied only where the hardware has PIM, and energy objectives."""

from __future__ import annotations

import pandas as pd
from dse_testkit import write_space

from dse.space import load_space
from dse.study import Driver


def test_dse_heterogeneous_hardware_menu_with_pim_and_energy(tmp_path):
    wl = {"generate": {"num_requests": 40, "arrival": "poisson", "rate": 4, "seed": 0,
                       "input": {"kind": "uniform", "low": 128, "high": 1024},
                       "output": {"kind": "uniform", "low": 32, "high": 128}}}
    path = write_space(tmp_path, hardware=["NPU", "NPU+PIM", "H100-SXM"], workload=wl,
                       budget={"total_devices": 4, "devices_per_node": 4},
                       slo={"p99_tpot_ms": 500},
                       objectives=["throughput_per_device", "energy_per_token", "avg_power"],
                       knobs={"tp": [2], "replicas": [1], "pim_mode": ["none", "local", "pool"],
                              "sub_batch_interleaving": [False, True]},
                       search={"sampler": "grid", "n_trials": 30, "seed": 0})
    space = load_space(path)
    out = tmp_path / "out"
    Driver(space, out, workers=0, progress=False).run()
    t = pd.read_csv(out / "trials.csv")
    done = t[t.state == "COMPLETE"] if "state" in t.columns else t
    assert set(done.hardware) == {"NPU", "NPU+PIM", "H100-SXM"}
    # PIM knobs only take effect on the PIM system
    assert set(done[done.hardware != "NPU+PIM"].pim_mode.dropna()) <= {"off"}
    assert {"local", "pool"} <= set(done[done.hardware == "NPU+PIM"].pim_mode)
    assert done.energy_per_token.notna().all() and (done.energy_per_token > 0).all()
    assert done.avg_power.notna().all()
