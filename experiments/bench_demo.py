"""`make demo` as a user runs it, timed from outside: search time after Ray is up, driver
and worker CPU seconds, old and new checkouts interleaved.

    python experiments/bench_demo.py [--runs 3] [--code DIR [--code DIR2]]
                                     [--space search_spaces/quickstart.yaml] [-- EXTRA ARGS]

Each run is ``dse search SPACE --fresh --no-progress`` (plus EXTRA ARGS, e.g. ``--backend
inproc``) in its own process, on the code under each ``--code`` (default: this checkout),
the checkouts taking turns. Read from the run's own summary: the search after the workers
are up and Ray's start-up; measured the same way for every checkout (so an old one without
the CPU line can be compared): the search after Ray is up (actors' start, their warm-up
where the checkout has one, and the search), the driver process's CPU seconds from the
pool's start to the end of ``Driver.run`` (all its threads: the loop, the MLflow writer,
Ray's) and the Ray actors' CPU seconds with their children (the ``astra-sim`` processes)
over the same span, via psutil, and over the actors' whole life (imports and warm-up
included: ``worker_life_cpu_s``). The best throughput per device on the front is printed, to check the knee is
found. Medians and [min..max] per checkout, with the 1-minute load average before each run
(the machine is shared: quote it).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import psutil, ray
import dse.cli, dse.pool, dse.study

mark = {}

def actor_cpu(pool):
    total = 0.0
    for a in pool._actors:
        try:
            pid = ray.get(pool._control(a, "pid"), timeout=10)
            proc = psutil.Process(pid)
            for q in [proc] + proc.children(recursive=True):
                c = q.cpu_times()
                total += c.user + c.system
        except Exception:
            pass
    return total

real_start, real_shutdown, real_run = (dse.pool.RayPool.start, dse.pool.RayPool.shutdown,
                                       dse.study.Driver.run)

def start(self):
    out = real_start(self)
    mark["cpu_up"], mark["workers_up"] = time.process_time(), actor_cpu(self)
    return out

def shutdown(self):
    life = actor_cpu(self)
    mark["workers"], mark["workers_life"] = life - mark.get("workers_up", 0.0), life
    return real_shutdown(self)

def run(self):
    out = real_run(self)
    mark["driver"] = time.process_time() - mark.get("cpu_up", 0.0)
    return out

dse.pool.RayPool.start, dse.pool.RayPool.shutdown, dse.study.Driver.run = start, shutdown, run
rc = dse.cli.main(sys.argv[1:])
sys.stderr.write("BENCH " + json.dumps(mark) + "\n")
sys.exit(rc)
"""


def run_once(code: Path, space: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="dse-demo-") as tmp:
        out = Path(tmp) / "out"
        env = {**os.environ, "PYTHONPATH": f"{code}:{code / 'astra-sim'}"}
        env.pop("RAY_ADDRESS", None)
        load = os.getloadavg()[0]
        p = subprocess.run([sys.executable, "-c", CHILD, "search", space, "--out", str(out),
                            "--fresh", "--no-progress", *extra], cwd=code, env=env,
                           capture_output=True, text=True)
        text = p.stdout + p.stderr
        if p.returncode != 0 or "BENCH " not in text:
            sys.exit(f"run failed (rc {p.returncode}):\n{text[-3000:]}")
        mark = json.loads(text.split("BENCH ", 1)[1].splitlines()[0])
        rows = list(csv.DictReader(open(out / "pareto.csv")))
        search = float(re.search(r"after the workers are up ([\d.]+)s", text)[1])
        start = re.search(r"workers start-up ([\d.]+)s \(Ray ([\d.]+)s, actors ([\d.]+)s"
                          r"(?:, warm-up ([\d.]+)s)?", text)
        warm = float(start[4] or 0.0)
        return {"search_s": search,
                # what the target counts: everything after ray.init returned
                "after_ray_s": float(start[3]) + warm + search,
                "ray_start_s": float(start[1]), "ray_init_s": float(start[2]),
                "warmup_s": warm,
                "driver_cpu_s": mark["driver"], "worker_cpu_s": mark["workers"],
                "worker_life_cpu_s": mark["workers_life"],
                "best_tps_per_device": max(float(r["throughput_per_device"]) for r in rows),
                "load": load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--space", default="search_spaces/quickstart.yaml")
    ap.add_argument("--code", type=Path, action="append")
    ap.add_argument("extra", nargs="*", help="more `dse search` arguments (after --)")
    a = ap.parse_args()
    codes = [c.resolve() for c in (a.code or [ROOT])]
    runs: dict[Path, list[dict]] = {c: [] for c in codes}
    for i in range(a.runs):
        for code in codes:
            r = run_once(code, a.space, a.extra)
            runs[code].append(r)
            print(f"{code} run {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()),
                  flush=True)
    for code, rs in runs.items():
        print(f"\n{code} ({len(rs)} runs): median [min..max]")
        for k in rs[0]:
            xs = [r[k] for r in rs]
            print(f"  {k:22s} {statistics.median(xs):9.2f} [{min(xs):.2f}..{max(xs):.2f}]")


if __name__ == "__main__":
    main()
