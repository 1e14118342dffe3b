"""Advanced serving features on the 300-request ShareGPT replays: results and wall time.

    python experiments/bench_features.py [--runs 3]

Runs the plain replay and the same workloads with PD disaggregation, a CPU prefix tier
with sharing, and the MoE DP+EP configuration of LLMServingSim's examples
(single_node_moe_dp_ep_instance.json: two RTX PRO 6000 instances in DP group A, ep 2,
tp 1, on the measured Qwen3-30B-A3B bundle), and prints TTFT/TPOT and the median wall time
relative to the plain replay.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import sim
from sim.paths import shared_data_root


def _cases():
    root = shared_data_root()
    cfg = root / "llmservingsim-configs" / "cluster"
    llama = sim.load_jsonl(root / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl")
    qwen = sim.load_jsonl(root / "workloads" / "sharegpt-qwen3-30b-a3b-300-sps10.jsonl")
    base = sim.SimOptions()
    return [
        ("plain (RTX4090 validation)", sim.load_cluster(root / "validation" / "RTX4090-Llama-3.1-8B"
                                                        / "cluster.json"), llama, base),
        ("2 instances (RTXPRO6000)", sim.load_cluster(cfg / "single_node_multi_instance.json"),
         llama, base),
        ("PD 1P:1D (RTXPRO6000)", sim.load_cluster(cfg / "single_node_pd_instance.json"), llama,
         base),
        ("2 inst + shared CPU prefix tier", sim.load_cluster(cfg / "single_node_multi_instance.json"),
         llama, base.replace(prefix_storage="CPU", enable_prefix_sharing=True)),
        ("MoE 2 inst, no DP (RTXPRO6000)", sim.load_cluster(cfg / "single_node_moe_multi_instance.json"),
         qwen, base),
        ("MoE DP group A, ep2 tp1", sim.load_cluster(cfg / "single_node_moe_dp_ep_instance.json"),
         qwen, base),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    for name, cluster, wl, opts in _cases():
        simulator = sim.Simulator(cluster, opts)
        walls, res = [], None
        for _ in range(args.runs):
            res = simulator.run(wl)
            walls.append(res.summary["wall_s"])
        rows.append((name, statistics.median(walls), res.summary))
    plain = rows[0][1]
    print(f"{'configuration':34s}{'TTFT mean':>11s}{'p99':>10s}{'TPOT mean':>11s}{'p99':>8s}"
          f"{'transfers':>10s}{'tier hits':>10s}{'wall s':>8s}{'x plain':>8s}")
    for name, wall, s in rows:
        print(f"{name:34s}{s['ttft_ms']['mean']:11.1f}{s['ttft_ms']['p99']:10.1f}"
              f"{s['tpot_ms']['mean']:11.2f}{s['tpot_ms']['p99']:8.2f}{s['kv_transfers']:10d}"
              f"{s['prefix_hit_tokens_lower_tier']:10d}{wall:8.3f}{wall / plain:8.2f}")
    print("(TTFT/TPOT in ms; wall = median over runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
