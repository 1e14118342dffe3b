"""``Driver(..., fresh=True)`` run again in the same process (a notebook rerunning a study
from scratch) starts over cleanly. Before, MLflow's cached store still held the deleted
``mlflow.db``: every write failed with "attempt to write a readonly database"."""

from __future__ import annotations

from dse_testkit import write_space

from dse.space import load_space
from dse.study import Driver

WORKLOAD = {"generate": {"num_requests": 10, "arrival": "poisson", "rate": 20,
                         "input": {"kind": "uniform", "low": 64, "high": 128},
                         "output": {"kind": "uniform", "low": 8, "high": 16}, "seed": 0}}


def test_fresh_rerun_in_the_same_process(tmp_path):
    space = load_space(write_space(tmp_path, workload=WORKLOAD, knobs={"tp": [1, 2]},
                                   search={"sampler": "grid", "n_trials": 2, "seed": 0}))
    out = tmp_path / "out"
    for _ in range(2):
        s = Driver(space, out, workers=0, fresh=True, progress=False).run()
        assert s.complete == 2 and s.failed == 0 and not s.resumed
    import sqlite3

    con = sqlite3.connect(out / "mlflow.db")
    assert con.execute("select count(*) from runs").fetchone()[0] == 3  # parent + 2
