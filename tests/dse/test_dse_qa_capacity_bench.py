"""A capacity search (``capacity.enabled``) finds each configuration's highest arrival rate
that meets the SLOs and reports the run at that rate; ``best/*.bench.sh`` must offer that
rate. Before, it offered the space's workload rate (60 req/s) to a configuration whose
capacity was 55 req/s: a benchmark of a load the simulation says violates the SLOs."""

from __future__ import annotations

import shlex

import pandas as pd
import pytest
from dse_testkit import write_space

from dse.space import load_space
from dse.study import Driver

WORKLOAD = {"generate": {"num_requests": 40, "arrival": "poisson", "rate": 60,
                         "input": {"kind": "uniform", "low": 128, "high": 1024},
                         "output": {"kind": "uniform", "low": 16, "high": 64}, "seed": 0}}


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """One capacity search over two configurations (both tests read its folder)."""
    tmp_path = tmp_path_factory.mktemp("capacity")
    space = load_space(write_space(
        tmp_path, workload=WORKLOAD, knobs={"tp": [1, 2], "replicas": [1]},
        capacity={"enabled": True, "start_rate": 5, "max_rate": 400, "tolerance": 0.1,
                  "max_probes": 8},
        search={"sampler": "grid", "n_trials": 2, "seed": 0}))
    out = tmp_path / "out"
    Driver(space, out, workers=0, progress=False).run()
    return out


def test_capacity_search_benches_at_the_capacity(out):
    front = pd.read_csv(out / "pareto.csv")
    assert len(front) >= 1
    for _, row in front.iterrows():
        stem = f"trial_{int(row['trial']):04d}"
        lines = (out / "best" / f"{stem}.bench.sh").read_text().splitlines()
        args = shlex.split(lines[-1])
        rate = float(args[args.index("--request-rate") + 1])
        assert abs(rate - row["capacity_rps"]) <= 1e-3 * row["capacity_rps"], (rate, row)
        assert any("capacity" in ln for ln in lines if ln.startswith("#")), lines
        serve = (out / "best" / f"{stem}.serve.sh").read_text()
        assert f"at {row['capacity_rps']:g} req/s" in serve, serve.splitlines()[:4]


def test_capacity_shows_in_the_pareto_tables(out, capsys):
    """The capacity a capacity search found is its main result: the report's Pareto table
    and ``dse show`` list it (before, neither had the column)."""
    html = (out / "report.html").read_text()
    assert "Capacity (highest rate meeting the SLOs) (req/s)" in html
    from dse.cli import main

    assert main(["show", str(out)]) == 0
    assert "capacity req/s" in capsys.readouterr().out
