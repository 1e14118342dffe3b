"""A knob given one value (``max_num_seqs: [64]`` or ``replicas: 1``) is part of every
configuration: the trial simulates it, and trials.csv, the Pareto table, ``best/`` and a
resumed study's record of what was simulated must show it too, not the vLLM default.
Before, everything rebuilt from the stored trial (Optuna records only searched knobs) fell
back to the defaults: trials.csv said max_num_seqs 256, and serve.sh launched 4 replicas
at --max-num-seqs 256 for a configuration simulated as one replica at 64."""

from __future__ import annotations

import json

import pandas as pd
from dse_testkit import write_space

from dse.space import load_space
from dse.study import Driver

WORKLOAD = {"generate": {"num_requests": 20, "arrival": "poisson", "rate": 20,
                         "input": {"kind": "uniform", "low": 64, "high": 256},
                         "output": {"kind": "uniform", "low": 8, "high": 32}, "seed": 0}}
KNOBS = {"tp": [1, 2], "replicas": [1], "max_num_seqs": [64],
         "max_num_batched_tokens": 1024}


def test_complete_fills_the_fixed_knobs_of_the_space(tmp_path):
    space = load_space(write_space(tmp_path, knobs=KNOBS))
    p = space.complete({"tp": 2})
    assert (p["replicas"], p["max_num_seqs"], p["max_num_batched_tokens"]) == (1, 64, 1024)
    # a conditional fixed knob applies only where it is active
    space = load_space(write_space(tmp_path, knobs={"tp": [1], "pd": [False, True],
                                                    "replicas": [2], "pd_ratio": ["1:1"]}))
    assert "pd_ratio" not in space.complete({"pd": False})
    assert space.complete({"pd": True})["pd_ratio"] == "1:1"


def test_reports_and_exports_show_the_fixed_knobs_simulated(tmp_path):
    space = load_space(write_space(tmp_path, workload=WORKLOAD, knobs=KNOBS,
                                   search={"sampler": "grid", "n_trials": 2, "seed": 0}))
    out = tmp_path / "out"
    Driver(space, out, workers=0, progress=False).run()
    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == 2
    assert set(trials["max_num_seqs"]) == {64}
    assert set(trials["max_num_batched_tokens"]) == {1024}
    assert list(trials["devices_used"]) == list(trials["tp"])  # one replica each
    front = pd.read_csv(out / "pareto.csv")
    assert len(front) >= 1 and set(front["max_num_seqs"]) == {64}
    for serve in (out / "best").glob("*.serve.sh"):
        text = serve.read_text()
        assert text.count("vllm serve") == 1, text
        assert "--max-num-seqs 64 " in text and "--max-num-batched-tokens 1024 " in text
    for cluster in (out / "best").glob("*.cluster.json"):
        nodes = json.loads(cluster.read_text())["nodes"]
        assert sum(len(n["instances"]) for n in nodes) == 1
