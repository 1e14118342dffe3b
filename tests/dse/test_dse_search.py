"""End-to-end searches on small spaces: optimum, feasibility, tracking, determinism."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from dse_testkit import write_space

from dse.config import make_trial_config, precheck
from dse.metrics import objective_values, pareto_mask
from dse.space import load_space
from dse.study import Driver
from dse.worker import evaluate


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory, ray_session):
    tmp = tmp_path_factory.mktemp("grid")
    path = write_space(tmp)
    space = load_space(path)
    out = tmp / "out"
    summary = Driver(space, out, workers=2, deterministic=True, progress=False).run()
    return space, out, summary


def brute_force(space):
    rows = []
    for p in space.grid():
        cfg = make_trial_config(space, 0, p)
        if precheck(space, cfg):
            continue
        r = evaluate(space, {"number": 0, "cluster": cfg.cluster, "options": cfg.options})
        objs = objective_values(space, r.summary, r.slo, cfg.devices_used, "H100-SXM")
        rows.append({**cfg.params, **objs, "feasible": r.slo["feasible"]})
    return pd.DataFrame(rows)


def key(df):
    return {(int(r.tp), int(r.replicas), int(r.max_num_seqs)) for r in df.itertuples()}


def test_dse_grid_search_finds_brute_force_optimum_and_front(grid_run):
    space, out, summary = grid_run
    # the 6 configurations with tp*replicas > 4 devices are rejected before simulating and
    # do not count toward n_trials (capped at the 12 that pass the check)
    # (the search stops at the 12th simulation: the grid order decides how many it drew)
    assert summary.complete == 12 and summary.failed == 0
    assert 1 <= summary.rejected <= 6
    bf = brute_force(space)
    assert len(bf) == 12
    feas = bf[bf.feasible]
    assert len(feas) >= 2
    trials = pd.read_csv(out / "trials.csv")
    got = trials[trials.feasible]
    # single-objective optimum: best throughput per device among feasible configs
    best_bf = feas.loc[feas.throughput_per_device.idxmax()]
    best_got = got.loc[got.throughput_per_device.idxmax()]
    assert (best_got.tp, best_got.replicas, best_got.max_num_seqs) == \
        (best_bf.tp, best_bf.replicas, best_bf.max_num_seqs)
    assert best_got.throughput_per_device == pytest.approx(best_bf.throughput_per_device)
    # the Pareto front equals the brute-force front of feasible configs
    names = ["throughput_per_device", "p99_ttft"]
    bf_front = feas[pareto_mask(feas[names].to_numpy(float), ["maximize", "minimize"])]
    front = pd.read_csv(out / "pareto.csv")
    assert key(front) == key(bf_front)


def test_dse_pareto_trials_meet_every_slo(grid_run):
    space, out, _ = grid_run
    front = pd.read_csv(out / "pareto.csv")
    assert len(front) >= 1
    assert front.feasible.all()
    assert (front["ttft_ms.p99"] <= space.slo["p99_ttft_ms"]).all()
    assert (front["tpot_ms.p99"] <= space.slo["p99_tpot_ms"]).all()
    cons = [c for c in front.columns if c.startswith("constraint.")]
    assert cons and (front[cons] <= 0).all().all()
    trials = pd.read_csv(out / "trials.csv")
    # every completed trial carries the same constraint keys; rejected ones violate them
    assert trials[cons].notna().all().all()
    assert (trials[trials.rejected][cons] > 0).all().all()
    assert trials[trials.rejected].reason.str.contains("over the budget").all()


def test_dse_mlflow_parent_and_children(grid_run):
    from mlflow.tracking import MlflowClient

    _, out, _ = grid_run
    meta = json.loads((out / "study.json").read_text())
    assert meta["seed"] == 0 and "optuna" in meta["versions"]
    client = MlflowClient(meta["tracking_uri"])
    runs = client.search_runs([meta["experiment_id"]], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")
                == meta["mlflow_parent_run_id"]]
    n_rejected = int(pd.read_csv(out / "trials.csv").rejected.sum())
    assert n_rejected >= 1
    assert len(parents) == 1 and len(children) == 12 + n_rejected
    assert parents[0].data.params["sampler.seed"] == "0"
    assert "version.optuna" in parents[0].data.tags
    sims = [r for r in children if r.data.tags["rejected"] == "False"]
    assert len(sims) == 12
    r = sims[0]
    for p in ("tp", "replicas", "max_num_seqs", "cluster.devices_used", "cluster.num_instances"):
        assert p in r.data.params
    for m in ("objective/throughput_per_device", "objective/p99_ttft", "ttft/p99_ms",
              "throughput/throughput_rps", "constraint/p99_ttft_ms"):
        assert m in r.data.metrics
    assert not any("." in m for m in r.data.metrics)  # every metric sits in a group
    assert r.data.tags["latency_provider"] == "roofline"
    arts = {a.path for a in client.list_artifacts(r.info.run_id)}
    assert {"requests.csv", "cluster.json", "timeseries.csv", "latency_hist.png"} <= arts
    png = client.download_artifacts(r.info.run_id, "latency_hist.png", str(out / "dl"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # MLflow 3's UI opens a training-style experiment on its runs table
    exp = client.get_experiment(meta["experiment_id"])
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development"
    parent_arts = {a.path for a in client.list_artifacts(meta["mlflow_parent_run_id"])}
    assert {"pareto.csv", "report.html", "best"} <= parent_arts
    local = client.download_artifacts(r.info.run_id, "requests.csv", str(out / "dl"))
    assert len(pd.read_csv(local)) == 60
    rej = next(c for c in children if c.data.tags["rejected"] == "True")
    assert "over the budget" in rej.data.tags["reason"]


def test_dse_report_outputs(grid_run, capsys):
    from dse.cli import main

    _, out, _ = grid_run
    html = (out / "report.html").read_text()
    assert "Pareto front" in html and "roofline" in html and "vllm serve" in html
    assert html.count("plotly.min.js") == 1 and (out / "plotly.min.js").exists()
    assert len(html) < 1_500_000
    front = pd.read_csv(out / "pareto.csv")
    assert front["config"].is_unique
    best = sorted((out / "best").glob("*.serve.sh"))
    assert len(best) == len(front)  # every distinct Pareto configuration is exported
    assert "--tensor-parallel-size" in best[0].read_text()
    assert len(list((out / "best").glob("*.bench.sh"))) == len(front)
    cluster = json.loads(min((out / "best").glob("*.cluster.json")).read_text())
    import sim

    sim.parse_cluster(cluster, source="exported")
    assert main(["show", str(out)]) == 0
    assert "Pareto" in capsys.readouterr().out
    assert main(["report", str(out)]) == 0


def test_dse_deterministic_same_seed_same_trials(tmp_path, ray_session):
    knobs = {"tp": [1, 2, 4], "replicas": [1, 2, 4], "max_num_seqs": {"low": 8, "high": 256,
                                                                       "log": True}}
    runs = []
    for i in range(2):
        path = write_space(tmp_path, f"s{i}.yaml", knobs=knobs,
                           search={"sampler": "nsga2", "population_size": 4, "n_trials": 8,
                                   "seed": 7})
        out = tmp_path / f"out{i}"
        Driver(load_space(path), out, workers=2, deterministic=True, progress=False).run()
        df = pd.read_csv(out / "trials.csv")
        runs.append(df[["trial", "tp", "replicas", "max_num_seqs", "throughput_per_device",
                        "rejected"]])
    pd.testing.assert_frame_equal(runs[0], runs[1])
    assert (~runs[0].rejected).sum() == 8  # rejected draws do not count toward n_trials


def test_dse_capacity_mode_finds_highest_rate(tmp_path):
    wl = {"generate": {"num_requests": 150, "rate": 10, "seed": 0,
                       "input": {"kind": "uniform", "low": 256, "high": 2048},
                       "output": {"kind": "uniform", "low": 16, "high": 64}}}
    path = write_space(tmp_path, knobs={"tp": [1], "replicas": [1]}, workload=wl,
                       slo={"p99_ttft_ms": 150},
                       capacity={"enabled": True, "start_rate": 2, "max_rate": 200,
                                 "tolerance": 0.1},
                       search={"sampler": "grid", "n_trials": 1})
    space = load_space(path)
    out = tmp_path / "out"
    Driver(space, out, workers=0, progress=False).run()
    t = pd.read_csv(out / "trials.csv")
    cap = float(t.capacity_rps.iloc[0])
    assert 2 <= cap < 200
    # just above the found capacity the SLO fails; at it, it holds
    cfg = make_trial_config(space, 0, {"tp": 1, "replicas": 1})
    from dse.worker import _simulate, _Workloads

    wl = _Workloads()
    task = {"number": 0, "cluster": cfg.cluster, "options": cfg.options}
    assert _simulate(space, task, wl, cap).slo["feasible"]
    assert not _simulate(space, task, wl, cap * 1.25).slo["feasible"]
    assert np.isfinite(t.throughput_per_device.iloc[0])
