"""dse.table.Columns, the tables a worker sends back: the same CSV as the simulator's own
writer and the same SLO figures, quantiles and histogram as the DataFrame it replaced."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from dse_testkit import write_space

import sim
from dse import metrics as M
from dse.config import make_trial_config, precheck
from dse.space import load_space
from dse.table import Columns
from dse.tracking import latency_histogram_png
from sim.metrics import REQUEST_COLUMNS


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("table")
    space = load_space(write_space(tmp, slo={
        "p99_ttft_ms": 500, "attainment": {"target": 0.9, "ttft_ms": 200, "tpot_ms": 30}}))
    params = next(p for p in space.grid()
                  if precheck(space, make_trial_config(space, 0, p)) is None)
    cfg = make_trial_config(space, 0, params)
    cluster = sim.parse_cluster(cfg.cluster)
    opts = sim.SimOptions(**{**cfg.options, "backend": "inproc"})
    spec = sim.workload_from_mapping(space.workload["spec"])
    return space, sim.simulate(cluster, sim.generate(spec), opts), tmp


def test_csv_is_the_simulators_own(run):
    _, res, tmp = run
    res.write(tmp / "sim.csv", timeseries_csv=tmp / "ts.csv")
    Columns.from_rows(REQUEST_COLUMNS, res.request_rows()).to_csv(tmp / "ours.csv",
                                                                   index=False)
    Columns(res.timeseries.columns()).to_csv(tmp / "ours_ts.csv")
    assert (tmp / "ours.csv").read_bytes() == (tmp / "sim.csv").read_bytes()
    assert (tmp / "ours_ts.csv").read_bytes() == (tmp / "ts.csv").read_bytes()


def test_figures_match_the_dataframe(run):
    space, res, tmp = run
    frame = res.requests_table()
    cols = Columns.from_rows(REQUEST_COLUMNS, res.request_rows())
    assert len(cols) == len(frame) > 0 and cols.columns == list(frame.columns)
    assert "ttft_ns" in cols and "nope" not in cols
    assert M.evaluate_slos(res.summary, cols, space) == M.evaluate_slos(res.summary, frame,
                                                                       space)
    qa, qb = M.latency_quantiles(cols), M.latency_quantiles(frame)
    assert all(np.array_equal(qa[k], qb[k]) for k in qa)
    latency_histogram_png(cols, tmp / "a.png")
    latency_histogram_png(frame, tmp / "b.png")
    assert (tmp / "a.png").read_bytes() == (tmp / "b.png").read_bytes()
    assert cols.to_frame().equals(frame)
    assert pickle.loads(pickle.dumps(cols)) == cols


def test_missing_values_and_bad_shapes():
    t = Columns({"a": [1, None, 3], "b": [0.5, 1.5, 2.5]})
    assert t["a"].dtype == object and t["b"].dtype == float and len(t) == 3
    assert list(t.rows()) == [(1, 0.5), (None, 1.5), (3, 2.5)]
    assert len(Columns.from_rows(["x", "y"], [])) == 0
    with pytest.raises(ValueError, match="different lengths"):
        Columns({"a": [1, 2], "b": [1]})
