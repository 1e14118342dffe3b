"""experiments/moe_link_sensitivity.py: a replay with the cluster file's own link is the
plain replay; another link reaches the MoE exchange; the targets are read per statistic."""

from __future__ import annotations

import json

import pytest

from experiments.moe_link_sensitivity import CASE, replay_errors, replay_stats, within
from experiments.validate_vllm import (METRICS, STATS, cluster_file, measured_stats,
                                       run_validation, simulated_stats)
from sim.paths import shared_data_root

FOLDER = shared_data_root() / "validation" / CASE


@pytest.fixture(scope="module")
def measured():
    if not FOLDER.is_dir():
        pytest.skip("the MoE validation case is not in ../shared/data")
    return measured_stats(FOLDER / "vllm" / "requests.jsonl")


def test_the_files_own_link_gives_the_plain_replay(measured):
    link = json.loads(cluster_file(FOLDER).read_text())
    plain, _ = run_validation(FOLDER)
    assert replay_stats(FOLDER, link["link_bw"], link["link_latency"]) == \
        simulated_stats(plain.summary)


def test_a_faster_link_shortens_the_steps(measured):
    slow = replay_errors(FOLDER, 16, 20000, measured)
    fast = replay_errors(FOLDER, 32, 20000, measured)
    assert fast["tpot"]["mean"] < slow["tpot"]["mean"] - 1.0
    assert fast["ttft"]["mean"] < slow["ttft"]["mean"]


def test_within_reads_means_and_percentiles_apart():
    ok = {m: {st: 0.0 for st in STATS} for m in METRICS}
    assert within(ok, (5.0, 10.0))
    ok["ttft"]["p90"] = 9.9
    assert within(ok, (5.0, 10.0))
    ok["tpot"]["mean"] = -5.1
    assert not within(ok, (5.0, 10.0))
    ok["tpot"]["mean"] = 0.0
    ok["e2e"]["p99"] = 10.1
    assert not within(ok, (5.0, 10.0))
