"""QA: a cluster so slow that the simulated clock runs for years (a link_latency of 1e15
ns per message, a link_bw of 1e-300 GB/s: both accepted by the schema) hung `llmsim run`
building one time-series row per simulated second until memory ran out. The time series
has the same row cap as the arrivals (validate.MAX_SERIES_BUCKETS): past it the run stops
with a one-line error (exit 2) that says what to check."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sim_testkit import edited_hardware_catalogue

from sim.cli import main

REPO = Path(__file__).resolve().parents[2]
TP2 = REPO / "../shared/data/llmservingsim-configs/cluster/single_node_4_instance_2TP.json"

pytestmark = pytest.mark.skipif(not TP2.exists(), reason="shared data not present")


@pytest.mark.parametrize("field,value,hint", [
    ("link_latency", 1e15, "--timeseries-interval-s 7 or more"),  # 764 days: a wider row fits
    ("link_bw", 1e-300, "peak_tflops/mem_bw"),  # 1e298 s: no row width fits
])
def test_years_of_simulated_time_stop_with_one_line(tmp_path, capsys, field, value, hint):
    cluster = json.loads(TP2.read_text())
    cluster[field] = value
    (tmp_path / "c.json").write_text(json.dumps(cluster))
    (tmp_path / "w.jsonl").write_text('{"input_toks": 50, "output_toks": 5}\n')
    t0 = time.perf_counter()
    rc = main(["run", "--cluster", str(tmp_path / "c.json"), "--dataset",
               str(tmp_path / "w.jsonl"), "--output", str(tmp_path / "o.csv"),
               "--latency-provider", "roofline"])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert took < 20, took
    line = [ln for ln in err.splitlines() if "error" in ln]
    assert len(line) == 1, err
    for needle in ("simulated clock", "10,000,000", "link_bw/link_latency", hint):
        assert needle in line[0], (needle, line[0])


def test_clock_past_a_float_still_one_line(tmp_path, capsys, monkeypatch):
    # a catalogue peak of 1e-300 TFLOPS: the clock passes 1e308 ns, which the message
    # first formatted as a float (OverflowError traceback)
    (tmp_path / "w.jsonl").write_text('{"input_toks": 50, "output_toks": 5}\n')
    with edited_hardware_catalogue(tmp_path, monkeypatch, "RTXPRO6000.yaml",
                                   "peak_tflops: {bf16:", "peak_tflops: {bf16: 1.0e-300, x:"):
        rc = main(["run", "--cluster", str(TP2), "--dataset", str(tmp_path / "w.jsonl"),
                   "--output", str(tmp_path / "o.csv"), "--latency-provider", "roofline"])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "simulated clock reached" in err and "e+" in err, err
