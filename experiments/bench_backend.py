"""Per-iteration cost of the system backends: in-process astra-sim engine vs subprocess.

    python experiments/bench_backend.py [--requests 300] [--runs 5] [--iterations 200]
                                        [--combos 2x1,8x2]

Two tables, for TP 1/2/4/8 and PP 1/2 (Llama-3.1-8B on H100-SXM, roofline latency):

1. **Replay** (the default settings): the 300-request ShareGPT replay, each run with a
   fresh backend (its astra-sim process started before the clock, an empty reuse cache).
   Per-iteration backend cost is the time spent in ``backend.iteration_ns`` divided by
   its calls; "sent" is the share of iteration parts that went to the backend (the rest
   were reused). "warm" repeats the replay on the same backend, as a search worker does
   from its second trial on the same network. The per-request CSVs of every run of both
   backends must be identical.
2. **Cold** (``computation_reuse=False``): every iteration's graphs are simulated, on a
   stream of varied decode/prefill batch shapes; the raw cost of the protocol (trace files,
   a pipe round trip, parsing) against calling the engine directly.

Medians over ``--runs`` repetitions, with Python's garbage collector paused while the clock
runs (a collection landing inside a 10 us call would be charged to the backend).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time

import sim
from sim.backend import AstraInprocBackend, AstraSubprocessBackend
from sim.latency.base import BatchShape
from sim.paths import shared_data_root

COMBOS = [(tp, pp) for pp in (1, 2) for tp in (1, 2, 4, 8)]
#: issue #3's target for the subprocess client's per-iteration cost
TARGET_RATIO = 2.0


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


class TimedBackend:
    """Wraps a backend and accumulates the wall time of its ``iteration_ns`` calls."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.seconds = 0.0
        self.calls = 0

    def iteration_ns(self, inst, shape, load_bytes=0):
        t = time.perf_counter()
        try:
            return self.inner.iteration_ns(inst, shape, load_bytes)
        finally:
            self.seconds += time.perf_counter() - t
            self.calls += 1

    def run_graphs(self, *args, **kwargs):
        return self.inner.run_graphs(*args, **kwargs)

    def close(self) -> None:
        self.inner.close()


def _timed_replay(backend, kind: str, tp: int, pp: int, workload) -> dict:
    opts = sim.SimOptions(latency_provider="roofline", backend=kind, max_num_seqs=256,
                          max_num_batched_tokens=2048)
    sent0 = getattr(backend, "exchanges", 0)
    timed = TimedBackend(backend)
    gc.collect()
    gc.disable()  # a collection pause landing inside a 10 us call would swamp it
    try:
        t = time.perf_counter()
        res = sim.simulate(_cluster(tp, pp), workload, opts, backend=timed)
        wall = time.perf_counter() - t
    finally:
        gc.enable()
    parts = 1 + (pp > 1)  # block, hop (the ends part only when KV is loaded)
    sent = getattr(backend, "exchanges", 0) - sent0
    return {"us": timed.seconds / max(1, timed.calls) * 1e6, "wall": wall,
            "calls": timed.calls, "sent": sent / max(1, parts * timed.calls),
            "csv": res.requests_table().to_csv(index=False)}


def _replay_once(kind: str, tp: int, pp: int, workload) -> tuple[dict, dict]:
    """(cold, warm): a replay on a fresh backend, then the same replay again on it (what
    a search worker sees once its backend has served a trial on the same network)."""
    backend = AstraSubprocessBackend() if kind == "subprocess" else AstraInprocBackend()
    try:
        # Start the astra-sim process (about 0.2 s, paid once per search worker, not per
        # simulation) outside the timing, then forget what the warm-up computed.
        sim.simulate(_cluster(tp, pp), sim.generate(sim.WorkloadSpec(num_requests=1)),
                     sim.SimOptions(latency_provider="roofline"), backend=backend)
        backend.clear_reuse()
        cold = _timed_replay(backend, kind, tp, pp, workload)
        warm = _timed_replay(backend, kind, tp, pp, workload)
        return cold, warm
    finally:
        backend.close()


def replay_table(requests: int, runs: int) -> None:
    path = shared_data_root() / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl"
    if not path.is_file():
        print(f"(replay table skipped: {path} is not present)")
        return
    workload = sim.load_jsonl(path, limit=requests)
    print(f"Replay: {requests} ShareGPT requests, fresh backend per run, median of {runs}; "
          "us per iteration")
    print(f"{'tp':>3s}{'pp':>4s}{'iters':>7s}{'in-process':>12s}{'subprocess':>12s}{'ratio':>7s}"
          f"{'sent':>7s}{'warm in':>9s}{'warm sub':>10s}{'ratio':>7s}{'wall in/sub s':>15s}"
          f"{'identical':>11s}")
    ratios, warm_ratios = [], []
    for tp, pp in COMBOS:
        res = {}
        for kind in ("inproc", "subprocess"):
            rs = [_replay_once(kind, tp, pp, workload) for _ in range(runs)]
            res[kind] = {"us": statistics.median(c["us"] for c, _ in rs),
                         "warm": statistics.median(w["us"] for _, w in rs),
                         "wall": statistics.median(c["wall"] for c, _ in rs),
                         "calls": rs[0][0]["calls"], "sent": rs[0][0]["sent"],
                         "csvs": {r["csv"] for pair in rs for r in pair}}
        a, b = res["inproc"], res["subprocess"]
        same = len(a["csvs"] | b["csvs"]) == 1
        ratios.append(b["us"] / a["us"])
        warm_ratios.append(b["warm"] / a["warm"])
        print(f"{tp:3d}{pp:4d}{a['calls']:7d}{a['us']:12.1f}{b['us']:12.1f}"
              f"{ratios[-1]:7.2f}{b['sent']:7.1%}{a['warm']:9.1f}{b['warm']:10.1f}"
              f"{warm_ratios[-1]:7.2f}{a['wall']:7.2f}/{b['wall']:<7.2f}{same!s:>11s}")
    print(f"subprocess / in-process, worst row: {max(ratios):.2f} fresh, "
          f"{max(warm_ratios):.2f} warm (target: at most {TARGET_RATIO:g})")


def _cold_once(backend, inst, shapes) -> tuple[float, list[int]]:
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        cycles = [backend.iteration_ns(inst, s) for s in shapes]
        return (time.perf_counter() - t) / len(shapes), cycles
    finally:
        gc.enable()


def cold_table(iterations: int, runs: int) -> None:
    shapes = _shapes(iterations)
    print(f"\nCold (computation reuse off): {iterations} varied batch shapes, median of {runs}")
    print(f"{'tp':>3s}{'pp':>4s}{'in-process us/iter':>20s}{'subprocess us/iter':>20s}"
          f"{'ratio':>7s}{'identical':>11s}")
    ratios = []
    for tp, pp in COMBOS:
        res = {}
        for cls in (AstraInprocBackend, AstraSubprocessBackend):
            backend = cls(reuse=False)
            try:
                s = sim.Simulator(_cluster(tp, pp), sim.SimOptions(latency_provider="roofline"),
                                  backend=backend)
                inst = s.instances[0]
                _cold_once(backend, inst, shapes[:5])  # starts the process
                rs = [_cold_once(backend, inst, shapes) for _ in range(runs)]
            finally:
                backend.close()
            res[cls.name] = (statistics.median(r[0] for r in rs), rs[0][1])
        a, b = res["inproc"], res["subprocess"]
        ratios.append(b[0] / a[0])
        print(f"{tp:3d}{pp:4d}{a[0] * 1e6:20.0f}{b[0] * 1e6:20.0f}{ratios[-1]:7.1f}"
              f"{a[1] == b[1]!s:>11s}")
    print(f"subprocess / in-process, worst row: {max(ratios):.1f} (target: at most "
          f"{TARGET_RATIO:g}; every part pays for a trace write and read and a pipe round "
          "trip, which together cost about as much as the in-process call)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--combos", default="", help="e.g. 2x1,8x2 (TPxPP); default: all eight")
    args = ap.parse_args(argv)
    if args.combos:
        COMBOS[:] = [tuple(int(v) for v in c.split("x")) for c in args.combos.split(",")]
    replay_table(args.requests, args.runs)
    cold_table(args.iterations, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
