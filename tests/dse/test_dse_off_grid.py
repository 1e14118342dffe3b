"""A trial whose latency lookups left the measured grid is visible to the search: its
objectives carry off_grid_lookups, taken from the run summary (issue #14 item 1)."""

from __future__ import annotations

from types import SimpleNamespace

from dse.metrics import objective_values

SPACE = SimpleNamespace(price_per_device_hour=1.0)
SLO = {"good_output_tokens": 0.0}


def _summary(**kw):
    return {"simulated_s": 10.0, "gen_tps": 100.0, "ttft_ms": {"p99": 1.0},
            "tpot_ms": {"p99": 1.0}, **kw}


def test_off_grid_lookups_reach_the_trial_objectives():
    objs = objective_values(SPACE, _summary(latency_off_grid_lookups=7), SLO, 1, "H100-SXM")
    assert objs["off_grid_lookups"] == 7.0
    clean = objective_values(SPACE, _summary(latency_off_grid_lookups=0), SLO, 1, "H100-SXM")
    assert clean["off_grid_lookups"] == 0.0
