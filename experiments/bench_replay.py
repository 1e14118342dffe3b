"""Speed and memory of the simulator: the 300-request validation replay and synthetic runs.

    python experiments/bench_replay.py [--runs 5] [--process-runs 9] [--no-process]

Prints the median wall time over several runs, the speed-up over real (simulated) time,
and peak RSS, for the RTX 4090 ShareGPT replay and for synthetic workloads of growing
size (to show that cost grows linearly with the number of requests). Each run happens in
a fresh subprocess so peak RSS is per run. The first line says whether the simulator's hot
modules ran compiled (``llmsim native build``) or as their Python sources
(``LLMSIM_PURE_PYTHON=1 python experiments/bench_replay.py`` measures the latter).

Then the same replay as a user runs it, ``llmsim run ...`` as a process (through the
installed console script when there is one, else ``python -m sim``): the median over
``--process-runs`` of the whole process's wall time, its CPU time (user + sys) and peak
RSS, split into the time inside the simulator (the summary's ``wall_s``) and everything
else (interpreter start, imports, loading the cluster, model, bundle and workload, writing
the outputs). The first run uses an empty bundle cache (``sim.cache``) and is reported on
its own; the median is over the runs after it. The load average is printed with it: on a
shared machine wall time follows the load, CPU time much less.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time
import sim
from sim.paths import shared_data_root
kind, n = sys.argv[1], int(sys.argv[2])
if kind == "replay":
    root = shared_data_root()
    # at the real run's gpu_memory_utilization (its vllm/meta.json), as validate_vllm.py
    cluster = sim.load_cluster(root / "validation/RTX4090-Llama-3.1-8B/cluster.json").with_mem_util(0.9)
    wl = sim.load_jsonl(root / "workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl", limit=n)
    opts = sim.SimOptions(max_num_seqs=256, max_num_batched_tokens=2048)
else:
    cluster = sim.parse_cluster({"num_nodes": 1, "link_bw": 16, "link_latency": 1000, "nodes": [{
        "num_instances": 1, "cpu_mem": {"mem_size": 64, "mem_bw": 50, "mem_latency": 0},
        "instances": [{"model_name": "meta-llama/Llama-3.1-8B", "hardware": "RTX4090",
                       "npu_mem": {"mem_size": 24, "mem_bw": 1008, "mem_latency": 0,
                                   "mem_util": 0.9}, "num_npus": 1, "tp_size": 1}]}]})
    # A steady load the card can sustain (about 70% of its decode capacity).
    wl = sim.generate(sim.WorkloadSpec(num_requests=n, arrival="poisson", rate=2.0,
                                       input=sim.LengthDist("uniform", low=64, high=1024),
                                       output=sim.LengthDist("uniform", low=32, high=512), seed=1))
    opts = sim.SimOptions(max_num_seqs=256, max_num_batched_tokens=2048)
s = sim.Simulator(cluster, opts)
t = time.perf_counter(); r = s.run(wl); wall = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"wall_s": wall, "sim_s": r.summary["simulated_s"], "rss_mb": rss,
                  "finished": r.summary["num_finished"], "modules": sim.native_status()}))
"""


def run_child(kind: str, n: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(n)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench(kind: str, n: int, runs: int) -> dict:
    rs = [run_child(kind, n) for _ in range(runs)]
    wall = statistics.median(r["wall_s"] for r in rs)
    return {"kind": kind, "n": n, "wall_s": wall, "sim_s": rs[0]["sim_s"],
            "modules": rs[0]["modules"],
            "speedup": rs[0]["sim_s"] / wall, "rss_mb": max(r["rss_mb"] for r in rs),
            "us_per_req": 1e6 * wall / n}


def llmsim_command() -> list[str]:
    """The console script beside this interpreter (as installed), else ``python -m sim``."""
    script = Path(sys.executable).parent / "llmsim"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "sim"]


def run_process(out_dir: Path, cache_dir: Path) -> dict:
    """One ``llmsim run`` of the replay as a process: wall, CPU and peak RSS of the child,
    and the simulator's own wall time from the summary it wrote."""
    from sim.paths import shared_data_root

    root = shared_data_root()
    out = out_dir / "replay.csv"
    cmd = [*llmsim_command(), "run",
           "--cluster", str(root / "validation/RTX4090-Llama-3.1-8B/cluster.json"),
           "--dataset", str(root / "workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl"),
           "--max-num-seqs", "256", "--max-num-batched-tokens", "2048",
           "--gpu-memory-utilization", "0.9", "--max-model-len", "32768", "--output", str(out)]
    # this checkout's code, whatever the console script was installed from
    path = os.pathsep.join([str(REPO), str(REPO / "astra-sim"),
                            *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "LLMSIM_CACHE_DIR": str(cache_dir)}
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"llmsim run failed: {err}")
    summary = json.loads((out_dir / "replay.summary.json").read_text())
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024,
            "sim_s": summary["wall_s"]}


def bench_process(runs: int) -> tuple[dict, dict]:
    """(first run with an empty bundle cache, medians of ``runs`` runs after it)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    try:
        first = run_process(tmp, tmp / "cache")
        rs = [run_process(tmp, tmp / "cache") for _ in range(runs)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "sim_s")}
    med["rest_s"] = statistics.median(r["wall_s"] - r["sim_s"] for r in rs)
    med["rss_mb"] = max(r["rss_mb"] for r in rs)
    first["rest_s"] = first["wall_s"] - first["sim_s"]
    return first, med


def print_process(first: dict, med: dict, runs: int) -> None:
    print(f"\n`{' '.join(Path(c).name for c in llmsim_command())} run` of the 300-request "
          f"replay as a process (load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs):")
    print(f"{'':24s}{'wall s':>9s}{'CPU s':>9s}{'in simulator s':>16s}{'rest s':>9s}"
          f"{'peak RSS MB':>13s}")
    for label, r in ((f"median of {runs}", med), ("first (empty cache)", first)):
        print(f"{label:24s}{r['wall_s']:9.3f}{r['cpu_s']:9.3f}{r['sim_s']:16.3f}"
              f"{r['rest_s']:9.3f}{r['rss_mb']:13.0f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 3000, 10000])
    ap.add_argument("--process-runs", type=int, default=9,
                    help="runs of `llmsim run` as a process (after one with an empty cache); "
                         "0 skips the process-level measurement")
    ap.add_argument("--no-process", dest="process", action="store_false",
                    help="skip the process-level measurement")
    ap.add_argument("--process-only", action="store_true",
                    help="only the process-level measurement")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.process_runs < 0:
        ap.error("--runs must be at least 1 and --process-runs at least 0")
    if args.process_only and args.process_runs == 0:
        ap.error("--process-only needs --process-runs of at least 1")
    if args.process_runs == 0:
        args.process = False
    if args.process_only:
        print_process(*bench_process(args.process_runs), args.process_runs)
        return 0
    rows = [bench("replay", 300, args.runs)]
    rows += [bench("synthetic", n, max(1, args.runs // 2 if n >= 10000 else args.runs))
             for n in args.sizes]
    print(f"modules: {rows[0]['modules']}")
    print(f"{'workload':12s}{'requests':>9s}{'wall s (median)':>17s}{'simulated s':>13s}"
          f"{'x real time':>12s}{'us/request':>12s}{'peak RSS MB':>13s}")
    for r in rows:
        print(f"{r['kind']:12s}{r['n']:9d}{r['wall_s']:17.3f}{r['sim_s']:13.1f}{r['speedup']:12.0f}"
              f"{r['us_per_req']:12.0f}{r['rss_mb']:13.0f}")
    if args.process:
        print_process(*bench_process(args.process_runs), args.process_runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
