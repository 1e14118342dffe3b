"""Where the seconds of a search go: `make demo` (the quickstart, 100 trials) timed by phase.

    python experiments/bench_search.py [--runs 3] [--space search_spaces/quickstart.yaml]
                                       [--code DIR [--code DIR2]] [--workers N] [--json OUT]

Each run is a fresh ``dse search --fresh`` in its own subprocess, on the code under
``--code`` (default: this checkout; give several to compare them, their runs interleaved), with
timers wrapped around the functions that exist there: Ray start-up, actor start-up,
Optuna ask/tell, journal writes, MLflow logging, the report, and the driver's wait for
results. The table holds the median of each over the runs, the spread of the search time,
and the load average before and after (the machine is shared: quote it with the numbers).
Timers that nest (a journal write happens inside ask and tell) are listed as such.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import functools, json, sys, threading, time
T0 = time.perf_counter()
timers = {}
lock = threading.Lock()

def wrap(owner, name, key):
    fn = getattr(owner, name, None)
    if fn is None:
        return
    @functools.wraps(fn)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            d = time.perf_counter() - t
            who = "driver" if threading.current_thread() is threading.main_thread() else "thread"
            with lock:
                e = timers.setdefault(key, {"driver": 0.0, "thread": 0.0, "calls": 0})
                e[who] += d
                e["calls"] += 1
    setattr(owner, name, timed)

import optuna, optuna.storages.journal._storage as js
import dse.cli, dse.pool, dse.study, dse.tracking, dse.report
T_IMPORT = time.perf_counter() - T0
wrap(dse.pool, "init_ray", "ray_init")
wrap(dse.pool.RayPool, "start", "pool_start (ray_init + actors)")
wrap(dse.pool.RayPool, "poll", "pool.poll (waiting for results)")
wrap(optuna.study.Study, "ask", "optuna ask")
wrap(optuna.study.Study, "tell", "optuna tell")
wrap(js.JournalStorage, "_write_log", "journal writes (in ask/tell/attrs)")
wrap(dse.tracking.Tracker, "log_trial", "mlflow log_trial")
wrap(dse.tracking.Tracker, "open_parent", "mlflow open_parent")
wrap(dse.tracking.Tracker, "close_parent", "mlflow close_parent")
wrap(dse.tracking.Tracker, "__init__", "mlflow open store")
wrap(dse.report, "write_results", "report (write_results)")
wrap(dse.study, "write_results", "report (write_results)")
wrap(dse.study, "_distinct_configurations", "count distinct configurations")
wrap(dse.study.Driver, "_open_study", "open study (journal replay)")
wrap(dse.study.Driver, "_loop", "search loop")
wrap(dse.study.Driver, "_finish", "finish (report + close parent)")
wrap(dse.study.Driver, "run", "driver.run")
out_json = sys.argv[1]
rc = dse.cli.main(sys.argv[3:])
from pathlib import Path
out = Path(sys.argv[2])
st = optuna.load_study(study_name=json.loads((out / "study.json").read_text())["study_name"],
                       storage=dse.study.open_storage(out))
ws = [t.user_attrs.get("wall_s") for t in st.get_trials(deepcopy=False)
      if t.user_attrs.get("repeat_of") is None and t.user_attrs.get("wall_s") is not None]
json.dump({"rc": rc, "imports_s": T_IMPORT, "process_s": time.perf_counter() - T0,
           "timers": timers, "simulated_trials": len(ws), "simulate_sum_s": sum(ws),
           "trials": len(st.trials)}, open(out_json, "w"))
"""


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def run_once(code: Path, space: str, workers: int | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="dse-bench-") as tmp:
        out = Path(tmp) / "out"
        res = Path(tmp) / "t.json"
        args = ["search", space, "--out", str(out), "--fresh", "--no-progress"]
        if workers is not None:
            args += ["--workers", str(workers)]
        env = {**os.environ, "PYTHONPATH": f"{code}:{code / 'astra-sim'}"}
        env.pop("RAY_ADDRESS", None)
        load0 = _load()
        proc = subprocess.run([sys.executable, "-c", CHILD, str(res), str(out), *args],
                              cwd=code, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not res.exists():
            sys.exit(f"run failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        data = json.loads(res.read_text())
        data["load_before"], data["load_after"] = load0, _load()
        data["stdout"] = proc.stdout
        return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--space", default="search_spaces/quickstart.yaml")
    ap.add_argument("--code", type=Path, action="append",
                    help="checkout to time (repeat to compare several: runs interleave)")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--json", type=Path, help="also write every run's numbers here")
    a = ap.parse_args()
    codes = [c.resolve() for c in (a.code or [Path(__file__).resolve().parents[1]])]
    runs: dict[Path, list[dict]] = {c: [] for c in codes}
    for i in range(a.runs):
        for code in codes:
            r = run_once(code, a.space, a.workers)
            runs[code].append(r)
            print(f"{code} run {i + 1}: driver.run {r['timers']['driver.run']['driver']:.1f}s,"
                  f" load {r['load_before']} -> {r['load_after']}", file=sys.stderr,
                  flush=True)
    for code in codes:
        table(code, runs[code])
    if a.json:
        a.json.write_text(json.dumps({str(c): [{k: v for k, v in r.items() if k != "stdout"}
                                               for r in rs] for c, rs in runs.items()},
                                     indent=1))


def table(code: Path, runs: list[dict]) -> None:
    def med(xs):
        return statistics.median(xs) if xs else 0.0

    keys = sorted({k for r in runs for k in r["timers"]})
    print(f"\n{code} ({len(runs)} runs, median [min..max]; 'thread s' = off the driver's "
          "thread)")
    print(f"{'phase':44s} {'driver s':>22s} {'thread s':>9s} {'calls':>6s}")
    for k in keys:
        ds = [r["timers"].get(k, {}).get("driver", 0.0) for r in runs]
        ts = [r["timers"].get(k, {}).get("thread", 0.0) for r in runs]
        cs = [r["timers"].get(k, {}).get("calls", 0) for r in runs]
        print(f"{k:44s} {med(ds):8.2f} [{min(ds):5.2f}..{max(ds):5.2f}] {med(ts):9.2f} "
              f"{med(cs):6.0f}")
    for k in ("imports_s", "process_s", "simulate_sum_s", "simulated_trials", "trials"):
        xs = [r[k] for r in runs]
        print(f"{k:44s} {med(xs):8.2f} [{min(xs):5.2f}..{max(xs):5.2f}]")
    search = [r["timers"]["driver.run"]["driver"]
              - r["timers"].get("pool_start (ray_init + actors)", {}).get("driver", 0.0)
              for r in runs]
    print(f"{'search after Ray is up (run - pool_start)':44s} {med(search):8.2f} "
          f"[{min(search):5.2f}..{max(search):5.2f}]")
    print("load average (1/5/15 min) before -> after: "
          + "; ".join(f"{r['load_before']} -> {r['load_after']}" for r in runs))
    lines = [ln for ln in runs[-1]["stdout"].splitlines() if ln.strip()]
    print("last run's summary:\n  " + "\n  ".join(
        ln for ln in lines if not ln.lstrip().startswith(("┃", "│", "┏", "┡", "└")))[:3000])


if __name__ == "__main__":
    main()
