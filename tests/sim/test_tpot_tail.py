"""experiments/tpot_tail.py: the rank view and bootstrap interval of a validation statistic."""

import json
import shutil

import numpy as np
import pytest

from experiments.tpot_tail import bootstrap_interval, resolution_table, share_above
from sim.paths import shared_data_root


def test_share_above_counts_strictly_greater():
    v = np.array([1.0, 2.0, 2.0, 3.0])
    assert share_above(v, 2.0) == 0.25
    assert share_above(v, 0.5) == 1.0


def test_bootstrap_interval_is_wide_where_the_percentile_sits_in_a_gap():
    # 270 requests near 30 ms, 30 spread over 36..56 ms: the p90 falls where few
    # requests are, the p50 among many.
    rng = np.random.default_rng(1)
    v = np.concatenate([rng.normal(30, 0.5, 270), np.linspace(36, 56, 30)])
    lo50, hi50 = bootstrap_interval(v, 50)
    lo90, hi90 = bootstrap_interval(v, 90)
    p50, p90 = np.percentile(v, 50), np.percentile(v, 90)
    assert (hi50 - lo50) / p50 < 0.02
    assert (hi90 - lo90) / p90 > 0.05


def test_resolution_table_reports_a_two_request_rank_shift():
    meas = np.arange(1.0, 301.0)
    sim = meas.copy()
    sim[268:270] += 100  # two requests just below the measured p90 move above it
    row = {r[0]: r for r in resolution_table(meas, sim)}
    q, a, b, err, above, expected = row[90][:6]
    assert expected == 10
    assert round((above - expected) * len(meas) / 100) == 2
    assert row[50][3] == 0.0


VALID = shared_data_root() / "validation" / "RTX4090-Llama-3.1-8B"


@pytest.mark.skipif(not (VALID / "vllm" / "meta.json").is_file(), reason="no validation data")
def test_validation_replays_the_runs_block_count_and_max_model_len_on_request(tmp_path):
    from experiments.validate_vllm import run_validation

    meta = json.loads((VALID / "vllm" / "meta.json").read_text())
    meta["num_requests"] = 20  # a short replay of the same run's settings
    folder = tmp_path / VALID.name
    (folder / "vllm").mkdir(parents=True)
    shutil.copy(VALID / "cluster.json", folder / "cluster.json")
    (folder / "vllm" / "meta.json").write_text(json.dumps(meta))
    logged = meta["kv_cache"]["num_gpu_blocks"]
    derived, _ = run_validation(folder)
    replayed, _ = run_validation(folder, kv_blocks_from_run=True)
    kv_derived = derived.summary["kv_cache"]["0"]
    assert kv_derived["num_blocks"] == logged  # (sim/memory.py derives vLLM's 2,588)
    assert replayed.summary["kv_blocks"] == {"0": logged}
    assert kv_derived["max_model_len"] == meta["engine_kwargs"]["max_model_len"]
