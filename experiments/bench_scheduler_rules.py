"""The scheduler cases of issue 14 as numbers: a 16k-token prompt's TTFT at pipeline depth
1/2/4, and 8 requests sharing a 1,200-token prefix arriving together (prefix hits and
tokens computed). Run it on two checkouts to compare them.

    PYTHONPATH=.:astra-sim python experiments/bench_scheduler_rules.py
"""

from __future__ import annotations

import json
import random

import sim
from sim.workload import parse_jsonl_lines


def cluster(pp: int = 1) -> sim.ClusterConfig:
    return sim.parse_cluster({"num_nodes": 1, "link_bw": 450, "link_latency": 500, "nodes": [{
        "num_instances": 1, "instances": [{
            "model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
            "num_npus": pp, "tp_size": 1, "pp_size": pp}]}]})


def long_prompt_ttft_ms(pp: int) -> float:
    wl = parse_jsonl_lines([json.dumps({"input_toks": 16384, "output_toks": 2,
                                        "arrival_time_ns": 0})])
    res = sim.simulate(cluster(pp), wl, sim.SimOptions(latency_provider="roofline"))
    return res.summary["ttft_ms"]["mean"]


def shared_prefix() -> tuple[int, int]:
    rng = random.Random(0)
    prefix = [rng.randrange(100_000) for _ in range(1200)]
    lines = [json.dumps({"input_toks": 1264, "output_toks": 4, "arrival_time_ns": 0,
                         "input_tok_ids": prefix + [rng.randrange(100_000) for _ in range(64)]})
             for _ in range(8)]
    res = sim.simulate(cluster(), parse_jsonl_lines(lines),
                       sim.SimOptions(latency_provider="roofline", max_num_batched_tokens=16384))
    t = res.requests_table()
    hits = int(t.prefix_hit_tokens.sum())
    return hits, int(t.input_tokens.sum()) - hits


def main() -> None:
    print("case                                   value")
    for pp in (1, 2, 4):
        print(f"16k prompt TTFT, pp={pp} (ms)            {long_prompt_ttft_ms(pp):10.1f}")
    hits, computed = shared_prefix()
    print(f"8 x 1,200 shared: prefix-hit tokens      {hits:10d}")
    print(f"8 x 1,200 shared: prompt tokens computed {computed:10d}")


if __name__ == "__main__":
    main()
