"""Speed and memory of the simulator: the 300-request validation replay and synthetic runs.

    python experiments/bench_replay.py [--runs 5]

Prints the median wall time over several runs, the speed-up over real (simulated) time,
and peak RSS, for the RTX 4090 ShareGPT replay and for synthetic workloads of growing
size (to show that cost grows linearly with the number of requests). Each run happens in
a fresh subprocess so peak RSS is per run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

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
                  "finished": r.summary["num_finished"]}))
"""


def run_child(kind: str, n: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(n)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench(kind: str, n: int, runs: int) -> dict:
    rs = [run_child(kind, n) for _ in range(runs)]
    wall = statistics.median(r["wall_s"] for r in rs)
    return {"kind": kind, "n": n, "wall_s": wall, "sim_s": rs[0]["sim_s"],
            "speedup": rs[0]["sim_s"] / wall, "rss_mb": max(r["rss_mb"] for r in rs),
            "us_per_req": 1e6 * wall / n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 3000, 10000])
    args = ap.parse_args(argv)
    rows = [bench("replay", 300, args.runs)]
    rows += [bench("synthetic", n, max(1, args.runs // 2 if n >= 10000 else args.runs))
             for n in args.sizes]
    print(f"{'workload':12s}{'requests':>9s}{'wall s (median)':>17s}{'simulated s':>13s}"
          f"{'x real time':>12s}{'us/request':>12s}{'peak RSS MB':>13s}")
    for r in rows:
        print(f"{r['kind']:12s}{r['n']:9d}{r['wall_s']:17.3f}{r['sim_s']:13.1f}{r['speedup']:12.0f}"
              f"{r['us_per_req']:12.0f}{r['rss_mb']:13.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
