"""Time one simulated iteration of the astrasim backend, in-process vs subprocess.

The graph is a representative decoder iteration: ``--blocks`` transformer blocks, each
[compute, all-reduce, compute, all-reduce] on the TP group. For TP 1/2/4/8 on a Ring and
a Switch network it reports the median time per iteration of:

* inproc-spmd:  ``Engine.run`` with the same Graph object for every NPU (SPMD fast path)
* inproc-full:  ``Engine.run`` with unequal Graphs per NPU (the full multi-NPU event
                loop; equal graphs would take the SPMD fast path)
* subprocess:   writing ``<prefix>.<npu>.et`` for every NPU (a different graph each
                iteration), sending the prefix to one long-lived ``astra-sim`` process and
                reading its reply up to ``Waiting``

Usage: python experiments/bench_astrasim.py [--blocks 32] [--iters 30] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from astrasim import Engine, GraphBuilder, Network, SystemConfig, write_workload

SYSTEM = {"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
          "preferred-dataset-splits": 1, "all-reduce-implementation": ["ring"],
          "all-gather-implementation": ["ring"], "reduce-scatter-implementation": ["ring"],
          "all-to-all-implementation": ["ring"], "collective-optimization": "localBWAware",
          "local-mem-bw": 3350}


def build(npu: int, blocks: int, act_bytes: int, suffix: str = "", jitter: int = 0):
    b = GraphBuilder(npu)
    for _ in range(blocks):
        b.comp(15_000 + jitter, name="attn" + suffix)
        b.all_reduce(act_bytes, name="ar_attn" + suffix)
        b.comp(30_000, name="mlp" + suffix)
        b.all_reduce(act_bytes, name="ar_mlp" + suffix)
    return b.build()


def median_per_iter(fn, iters: int, repeats: int) -> float:
    fn()  # warm-up (memo tables, imports)
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t) / iters)
    return statistics.median(samples)


def read_until_waiting(proc) -> list[str]:
    lines = []
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("astra-sim exited: " + proc.stderr.read())
        if "Waiting" in line:
            return lines
        lines.append(line)


def bench_one(topo: str, tp: int, args, tmp: Path) -> tuple[int, float, float, float]:
    net_yml = tmp / f"{topo}{tp}.yml"
    net_yml.write_text(f"topology: [ {topo} ]\nnpus_count: [ {tp} ]\n"
                       f"bandwidth: [ 300.0 ]\nlatency: [ 1000.0 ]\n")
    sys_json = tmp / "system.json"
    sys_json.write_text(json.dumps(SYSTEM))
    eng = Engine(Network.load(net_yml), SystemConfig.from_dict(SYSTEM))
    g = build(0, args.blocks, args.act_bytes)
    spmd = {i: g.copy_for(i) for i in range(tp)}
    # node names differ per NPU, so the graphs are unequal and take the full path
    full = {i: build(i, args.blocks, args.act_bytes, f"@{i}") for i in range(tp)}
    cycles = eng.run(spmd)[0].cycles
    assert eng.run(full)[0].cycles == cycles
    t_spmd = median_per_iter(lambda: eng.run(spmd), args.iters, args.repeats)
    t_full = median_per_iter(lambda: eng.run(full), args.iters, args.repeats)

    proc = subprocess.Popen(
        [sys.executable, "-m", "astrasim", f"--network-configuration={net_yml}",
         f"--system-configuration={sys_json}", "--interactive"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, bufsize=1)
    read_until_waiting(proc)
    # a different graph every iteration (as a serving simulator sends), so the process's
    # parse cache never hits; graphs are built outside the timed loop, files written inside
    pool = []
    for k in range(args.iters * args.repeats + 1):
        gk = build(0, args.blocks, args.act_bytes, jitter=k)
        pool.append(({i: gk.copy_for(i) for i in range(tp)},
                     eng.run({i: gk.copy_for(i) for i in range(tp)})[0].cycles))
    counter = [0]

    def one():
        graphs, want = pool[counter[0]]
        prefix = tmp / f"it{counter[0]}"
        counter[0] += 1
        write_workload(prefix, graphs)
        proc.stdin.write(f"{prefix}\n")
        proc.stdin.flush()
        out = read_until_waiting(proc)
        assert f" {want} cycles" in out[0], out

    try:
        t_sub = median_per_iter(one, args.iters, args.repeats)
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        proc.wait(timeout=10)
    finally:
        proc.kill()
    return cycles, t_spmd, t_full, t_sub


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--act-bytes", type=int, default=256 * 4096 * 2,
                    help="all-reduce size (default: 256 tokens x 4096 hidden x fp16)")
    args = ap.parse_args()

    print(f"{args.blocks} blocks x [comp, all-reduce, comp, all-reduce] = "
          f"{4 * args.blocks} nodes per NPU; median of {args.repeats} x {args.iters} iterations")
    print(f"{'topology':<9} {'TP':>3} {'cycles':>12} {'inproc-spmd':>13} {'inproc-full':>13} "
          f"{'subprocess':>13}")
    with tempfile.TemporaryDirectory() as tmpdir:
        for topo in ("Ring", "Switch"):
            for tp in (1, 2, 4, 8):
                cycles, t_spmd, t_full, t_sub = bench_one(topo, tp, args, Path(tmpdir))
                print(f"{topo:<9} {tp:>3} {cycles:>12} {t_spmd * 1e6:>10.0f} us "
                      f"{t_full * 1e6:>10.0f} us {t_sub * 1e6:>10.0f} us")


if __name__ == "__main__":
    main()
