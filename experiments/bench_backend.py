"""Per-iteration cost of the system backends: in-process astra-sim engine vs subprocess.

    python experiments/bench_backend.py [--iterations 200]

For TP 1/2/4/8 and PP 1/2 (Llama-3.1-8B, H100-SXM, roofline latency), times
``backend.iteration_ns`` on a stream of varied decode/prefill batch shapes, median of 3
repetitions, and checks that both backends return identical cycles.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import sim
from sim.latency.base import BatchShape


def _cluster(tp: int, pp: int) -> sim.ClusterConfig:
    return sim.parse_cluster({"num_nodes": 1, "link_bw": 450, "link_latency": 500, "nodes": [{
        "num_instances": 1, "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 0},
        "instances": [{"model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
                       "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
                       "num_npus": tp * pp, "tp_size": tp, "pp_size": pp}]}]})


def _shapes(n: int) -> list[BatchShape]:
    rng = random.Random(0)
    out = []
    for _ in range(n):
        nd = rng.randrange(1, 128)
        kv = [rng.randrange(16, 4096) for _ in range(nd)]
        pf = rng.choice([0, 0, 0, rng.randrange(16, 2048)])
        out.append(BatchShape(nd + pf, nd + (1 if pf else 0), pf, 0, nd, sum(kv), max(kv), min(kv)))
    return out


def _time(backend, inst, shapes) -> tuple[float, list[int]]:
    t = time.perf_counter()
    cycles = [backend.iteration_ns(inst, s) for s in shapes]
    return (time.perf_counter() - t) / len(shapes), cycles


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=200)
    args = ap.parse_args(argv)
    shapes = _shapes(args.iterations)
    print(f"{'tp':>3s}{'pp':>4s}{'in-process us/iter':>20s}{'subprocess us/iter':>20s}"
          f"{'ratio':>7s}{'identical':>11s}")
    for pp in (1, 2):
        for tp in (1, 2, 4, 8):
            res = {}
            for kind in ("inproc", "subprocess"):
                s = sim.Simulator(_cluster(tp, pp), sim.SimOptions(latency_provider="roofline",
                                                                   backend=kind))
                inst = s.instances[0]
                runs = [_time(s.backend, inst, shapes) for _ in range(3)]
                res[kind] = (statistics.median(r[0] for r in runs), runs[0][1])
                s.close()
            a, b = res["inproc"], res["subprocess"]
            print(f"{tp:3d}{pp:4d}{a[0] * 1e6:20.0f}{b[0] * 1e6:20.0f}{b[0] / a[0]:7.1f}"
                  f"{a[1] == b[1]!s:>11s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
