"""`llmsim bench` over a grid: Llama-3.1-70B-Instruct FP8 on H100 / H200, TP 1-8,
concurrency 4-64, input 1k with output 1k and 8k (issue #17).

Every point is the command line a user would give `vllm bench serve` against
`vllm serve RedHatAI/Llama-3.1-70B-Instruct-FP8 -tp N`, answered by the simulator:

    llmsim bench --model Llama-3.1-70B-FP8 --hardware H100-SXM -tp 4 \\
        --dataset-name random --random-input-len 1024 --random-output-len 8192 \\
        --max-concurrency 16 --num-prompts 32

Prints one row per point (mean TTFT / TPOT, output throughput, the provider `auto` picked)
and the total wall and CPU time (the wall time depends on how loaded the machine is). Each
point sends ``--prompts-per-client`` x concurrency prompts (closed loop). Usage: python experiments/bench_grid_fp8.py [--prompts-per-client 2]
[--latency-provider auto]
"""

from __future__ import annotations

import argparse
import time

from sim.bench import add_bench_args, run_bench
from sim.errors import InputError

MODEL = "RedHatAI/Llama-3.1-70B-Instruct-FP8"
HARDWARE = ("H100-SXM", "H200-SXM")
TPS = (1, 2, 4, 8)
CONCURRENCY = (4, 16, 64)
LENGTHS = ((1024, 1024), (1024, 8192))


def point_args(hw: str, tp: int, conc: int, isl: int, osl: int, per_client: int,
               provider: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_bench_args(p)
    return p.parse_args([
        "--model", MODEL, "--hardware", hw, "-tp", str(tp), "--dataset-name", "random",
        "--random-input-len", str(isl), "--random-output-len", str(osl),
        "--max-concurrency", str(conc), "--num-prompts", str(per_client * conc),
        "--max-num-batched-tokens", "8192", "--latency-provider", provider])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts-per-client", type=int, default=2)
    ap.add_argument("--latency-provider", default="auto")
    a = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    print(f"{'hardware':9s} {'tp':>2s} {'conc':>4s} {'in':>5s} {'out':>5s} "
          f"{'TTFT ms':>9s} {'TPOT ms':>8s} {'out tok/s':>10s} {'tok/s/GPU':>9s} "
          f"{'wall s':>6s}  provider")
    for hw in HARDWARE:
        for tp in TPS:
            for conc in CONCURRENCY:
                for isl, osl in LENGTHS:
                    t = time.perf_counter()
                    try:
                        res, _ = run_bench(point_args(hw, tp, conc, isl, osl,
                                                      a.prompts_per_client, a.latency_provider))
                    except InputError as exc:
                        print(f"{hw:9s} {tp:>2d} {conc:>4d} {isl:>5d} {osl:>5d}  -- {exc}"[:150])
                        break   # same error for every length of this (hw, tp, conc)
                    prov = res["simulator"]["latency_provider"]
                    print(f"{hw:9s} {tp:>2d} {conc:>4d} {isl:>5d} {osl:>5d} "
                          f"{res['mean_ttft_ms']:>9.1f} {res['mean_tpot_ms']:>8.2f} "
                          f"{res['output_throughput']:>10.0f} "
                          f"{res['output_throughput'] / tp:>9.0f} "
                          f"{time.perf_counter() - t:>6.2f}  {prov}")
    print(f"\ntotal: {time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU")


if __name__ == "__main__":
    main()
