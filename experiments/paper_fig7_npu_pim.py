"""The shape of LLMServingSim's Fig. 7 (IISWC 2024): NPU-only vs NPU+PIM serving throughput.

The paper's Fig. 7 compares LLMServingSim's NPU+PIM throughput with NeuPIMs' for GPT-3
models of 7B to 30B (256 Alpaca requests, NPU/PIM counts and parallelism chosen per model)
and reports that the two agree within 20% (geomean error 8.88%); NeuPIMs itself reports
that the NPU+PIM system, with sub-batch interleaving, beats an NPU-only system. We have
neither simulator, so we reproduce the shape of the comparison inside this project:
generated tokens/s of three systems on the paper's Table I hardware,

- NPU only: the KV cache lives in the NPU's 24 GB next to the weights;
- NPU+PIM: decode attention (score and attend GEMVs) runs on NeuPIMs-32GB-1TBps devices in
  the node's memory, which also hold the KV cache (``enable_attn_offloading``); the NPU and
  PIM alternate every layer;
- NPU+PIM with NeuPIMs' sub-batch interleaving (two half-batches overlap NPU and PIM work).

Hardware: ``NPU`` (128x128 systolic array at 1 GHz = 32.8 TFLOPS, 24 GB at 936 GB/s),
links 64 GB/s / 100 ns (PCIe 4.0 x16, Table I), 8 PIM devices (256 GiB) per node reached
over a 64 GB/s, 100 ns path, roofline latency. One instance per model, tp chosen so the
weights fit (checked with ``sim.validate_cluster``).

Workload: 256 requests (the paper's count), all arriving at t=0 so the system is
saturated, (input, output) lengths sampled jointly with a fixed seed from the ShareGPT
trace in ../shared/data/workloads (clipped to GPT-3's 2048-token context), or from a
uniform distribution if the trace is absent. ShareGPT rather than Alpaca: the outputs are
long (decode-heavy), as in the paper's Fig. 6, and the trace ships with the project.

Run: ``.venv/bin/python experiments/paper_fig7_npu_pim.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import sim
from sim.paths import shared_data_root
from sim.request import Request

MODELS = (("GPT3-7B", 1), ("GPT3-13B", 2), ("GPT3-30B", 4))
MODES = (
    ("NPU", {}),
    ("NPU+PIM", {"enable_attn_offloading": True}),
    ("NPU+PIM+SBI", {"enable_attn_offloading": True, "enable_sub_batch_interleaving": True}),
)
LINK_BW, LINK_LAT = 64, 100           # Table I: 64 GB/s, 100 ns
PIM = "NeuPIMs-32GB-1TBps"
PIM_MEM_GIB = 256                      # 8 x 32 GiB PIM devices per node
CONTEXT = 2048                         # GPT-3's context window
TRACE = "workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl"


def cluster(model: str, tp: int) -> sim.ClusterConfig:
    return sim.parse_cluster({
        "num_nodes": 1, "link_bw": LINK_BW, "link_latency": LINK_LAT,
        "nodes": [{
            "num_instances": 1,
            "cpu_mem": {"mem_size": PIM_MEM_GIB, "mem_bw": LINK_BW, "mem_latency": LINK_LAT,
                        "pim_config": PIM},
            "instances": [{"model_name": model, "hardware": "NPU",
                           "npu_mem": {"mem_size": 24, "mem_bw": 936, "mem_latency": 0},
                           "num_npus": tp, "tp_size": tp}],
        }]}, source=f"<fig7 {model} tp{tp}>")


def workload(n: int, seed: int) -> tuple[sim.Workload, str]:
    rng = np.random.default_rng(seed)
    trace = shared_data_root() / TRACE
    if trace.is_file():
        pool = sim.load_jsonl(trace).all_requests()
        idx = rng.integers(0, len(pool), size=n)
        pairs = [(pool[i].input_len, pool[i].output_len) for i in idx]
        source = f"ShareGPT lengths ({trace.name})"
    else:
        pairs = list(zip(rng.integers(16, 1025, size=n), rng.integers(16, 1025, size=n)))
        source = "uniform[16, 1024] lengths (ShareGPT trace not found)"
    reqs = []
    for rid, (i, o) in enumerate(pairs):
        i = int(min(i, CONTEXT // 2))
        o = int(max(1, min(o, CONTEXT - i)))
        reqs.append(Request(rid, 0, i, o))
    return sim.Workload(reqs, source=source), source


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-reqs", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    args = ap.parse_args(argv)

    base = sim.SimOptions(latency_provider="roofline", max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=2048, enable_prefix_caching=False,
                          pim_mode="local", seed=args.seed)
    wl, source = workload(args.num_reqs, args.seed)
    n_in = sum(r.input_len for r in wl.requests)
    n_out = sum(r.output_len for r in wl.requests)
    print(f"workload: {len(wl.requests)} requests at t=0, {source}; mean input "
          f"{n_in / len(wl.requests):.0f}, mean output {n_out / len(wl.requests):.0f} tokens")
    print(f"hardware: NPU (Table I), links {LINK_BW} GB/s / {LINK_LAT} ns, {PIM} x "
          f"{PIM_MEM_GIB // 32} per node; roofline latency\n")

    rows = []
    t0 = time.perf_counter()
    for model, tp in MODELS:
        cl = cluster(model, tp)
        base_tput = None
        for mode, kw in MODES:
            opts = base.replace(**kw)
            sim.validate_cluster(cl, opts)  # weights fit in 24 GB at this tp, PIM present
            s = sim.Simulator(cl, opts)
            blocks = s.instances[0].num_kv_blocks
            try:
                res = s.run(wl)
            finally:
                s.close()
            summ = res.summary
            tput = summ["gen_tps"]
            if base_tput is None:
                base_tput = tput
            rows.append((model, tp, mode, tput, tput / base_tput, summ["tpot_ms"]["mean"],
                         blocks * opts.block_size, summ["preemptions"], summ["wall_s"]))
    wall = time.perf_counter() - t0

    hdr = (f"{'model':<10} {'tp':>2} {'mode':<12} {'gen tok/s':>10} {'speed-up':>8} "
           f"{'TPOT ms':>8} {'KV tokens':>10} {'preempt':>7}")
    print(hdr)
    print("-" * len(hdr))
    for model, tp, mode, tput, sp, tpot, kv, pre, _ in rows:
        print(f"{model:<10} {tp:>2} {mode:<12} {tput:>10.1f} {sp:>7.2f}x {tpot:>8.2f} "
              f"{kv:>10,} {pre:>7}")
    print(f"\n(total wall time {wall:.1f} s)")

    pim = [r[4] for r in rows if r[2] == "NPU+PIM"]
    sbi = [r[4] for r in rows if r[2] == "NPU+PIM+SBI"]
    print(
        "\nPaper (Sec. VI-B, Fig. 7): Fig. 7 plots no NPU-only bar; it compares LLMServingSim's "
        "NPU+PIM throughput with NeuPIMs' for GPT-3 7B-30B under several parallelism schemes and "
        "reports the same trend, LLMServingSim slightly lower (it models links and "
        "synchronization), within 20% (geomean error 8.88%). Here, on the Table I hardware, "
        f"NPU+PIM gives {min(pim):.2f}x-{max(pim):.2f}x and NPU+PIM with sub-batch interleaving "
        f"{min(sbi):.2f}x-{max(sbi):.2f}x the NPU-only generation throughput"
        + (", the gain shrinking as the model grows (less PIM KV capacity per request, more "
           "NPU time per token); " if pim == sorted(pim, reverse=True) else "; ")
        + ("offloading helps and interleaving helps further, the direction NeuPIMs-style systems "
           "are built on." if min(sbi) > 1.0 and all(b >= a for a, b in zip(pim, sbi))
           else "note that the direction does NOT match in every row (see the table)."))
    return 0


if __name__ == "__main__":
    sys.exit(main())
