"""Ray actors warm up before their first trial (dse.worker.warm_up): one configuration per
instance shape of the space, simulated on the workload's first requests, its result
dropped. What it leaves behind (latency providers, astra-sim processes, the workload) is
what a worker keeps across trials anyway, so a trial's result must not depend on it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from dse_testkit import write_space

from dse.config import make_trial_config, precheck
from dse.pool import RayPool, warmup_tasks
from dse.space import load_space
from dse.worker import _Workloads, evaluate, warm_up

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "search_spaces" / "quickstart.yaml"

#: one trial, in a fresh process, with or without the warm-up first (argv: mode, knobs)
CHILD = r"""
import json, sys
from dse.config import make_trial_config
from dse.pool import warmup_tasks
from dse.space import load_space
from dse.worker import _Workloads, evaluate, warm_up

space = load_space(sys.argv[1])
wl = _Workloads()
if sys.argv[2] == "warm":
    out = warm_up(space, warmup_tasks(space), wl)
    assert out["configs"] == 4 and not out["errors"], out
results = []
for params in json.loads(sys.argv[3]):
    cfg = make_trial_config(space, 7, params)
    res = evaluate(space, {"number": 7, "cluster": cfg.cluster, "options": cfg.options,
                           "default_backend": "subprocess"}, wl)
    assert res.simulated, (res.error, res.rejected)
    summary = {k: v for k, v in res.summary.items()
               if k not in ("wall_s", "speedup_vs_real_time")}
    rows = {c: [None if v != v else v for v in res.requests[c].tolist()]
            for c in res.requests.columns}
    results.append({"summary": summary, "requests": rows, "slo": res.slo,
                    "timeseries": {c: res.timeseries[c].tolist() for c in res.timeseries}})
print(json.dumps(results, sort_keys=True, default=str))
"""


def test_one_warm_up_task_per_instance_shape():
    space = load_space(QUICKSTART)
    tasks = warmup_tasks(space)
    # the quickstart's shapes differ by tp only (replicas, batch limits, caching and
    # routing build nothing per process)
    tps = sorted(t["cluster"]["nodes"][0]["instances"][0]["tp_size"] for t in tasks)
    assert tps == [1, 2, 4, 8], tasks
    assert len({t["number"] for t in tasks}) == len(tasks) and all(t["number"] < 0
                                                                  for t in tasks)
    assert warmup_tasks(space, limit=2) == tasks[:2]


def test_a_trial_gives_the_same_result_with_and_without_the_warm_up():
    knobs = [{"tp": 2, "replicas": 1, "max_num_seqs": 256, "max_num_batched_tokens": 2048,
              "enable_prefix_caching": True, "routing_policy": "LOAD"},
             {"tp": 1, "replicas": 4, "max_num_seqs": 64, "max_num_batched_tokens": 8192,
              "enable_prefix_caching": False, "routing_policy": "RR"}]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'astra-sim'}"}
    outs = {}
    for mode in ("cold", "warm"):
        p = subprocess.run([sys.executable, "-c", CHILD, str(QUICKSTART), mode,
                            json.dumps(knobs)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        outs[mode] = p.stdout
    assert outs["cold"] == outs["warm"]
    assert len(json.loads(outs["warm"])[0]["requests"]["ttft_ns"]) == 300


def test_warm_up_reports_what_fails_and_never_raises(tmp_path):
    space = load_space(write_space(tmp_path))
    params = next(p for p in space.grid()
                  if precheck(space, make_trial_config(space, 0, p)) is None)
    cfg = make_trial_config(space, -1, params)
    bad = {"number": -2, "cluster": {"instances": "not a list"}, "options": cfg.options}
    good = {"number": -1, "cluster": cfg.cluster, "options": cfg.options}
    out = warm_up(space, [bad, good], _Workloads(), default_backend="inproc")
    assert out["configs"] == 2 and len(out["errors"]) == 1, out
    # the worker goes on to run trials as usual
    res = evaluate(space, {**good, "number": 0}, _Workloads())
    assert res.simulated, res.error
    broken = dataclasses.replace(space, workload={"kind": "file",
                                                  "path": str(tmp_path / "missing.jsonl")})
    out = warm_up(broken, [good], _Workloads())
    assert out["configs"] == 0 and "workload" in out["errors"][0], out


def test_ray_pool_warms_its_actors_before_the_first_trial(tmp_path, ray_session):
    space = load_space(write_space(tmp_path))
    tasks = warmup_tasks(space)
    assert tasks
    pool = RayPool(space, 1, warmup=tasks).start()
    try:
        assert pool.timings["warmup_configs"] == len(tasks)
        assert pool.timings["warmup_s"] > 0 and pool.timings["warmup_cpu_s"] > 0
        pool.submit({**tasks[0], "number": 0})
        results = []
        for _ in range(600):
            results += pool.poll(timeout=0.5)
            if results:
                break
    finally:
        pool.shutdown()
    assert [r.number for r in results] == [0] and results[0].simulated, results


#: a trial in a fresh process, as an actor runs it: which heavy packages it imported
NO_PANDAS = r"""
import sys
from dse.config import make_trial_config
from dse.space import load_space
from dse.worker import SimWorker

space = load_space(sys.argv[1])
params = next(iter(space.grid()))
cfg = make_trial_config(space, 0, params)
res = SimWorker(space).run({"number": 0, "cluster": cfg.cluster, "options": cfg.options})
assert res.simulated, res.error or res.rejected
print(sorted(m for m in ("pandas", "mlflow", "optuna") if m in sys.modules))
"""


def test_a_worker_runs_a_trial_without_importing_pandas(tmp_path):
    """The per-request and time-series tables travel as dse.table.Columns: importing pandas
    cost each actor ~0.5 s of CPU and building, pickling and unpickling two DataFrames a
    trial ~2 ms (before, sim's requests_table() imported it in every actor)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'astra-sim'}"}
    p = subprocess.run([sys.executable, "-c", NO_PANDAS, str(write_space(tmp_path))],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "[]"
