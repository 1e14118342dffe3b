"""Replay the likely unseen vLLM runs and check them against what the bundles and vLLM's
code say: RTX PRO 6000, Llama-3.1-8B TP1/TP2 and Qwen3-32B TP1/TP2, 300 ShareGPT requests
at 10 req/s (the workloads folder's files), measured latency profiles.

    python experiments/tp_replay_audit.py [--max-num-seqs 256] [--max-num-batched-tokens 2048]

The cluster is the visible RTX PRO 6000 run's (validation/RTXPRO6000-Qwen3-30B-A3B-DP2-EP2/
cluster.json: its node, link and npu_mem), with one instance of the model at the TP degree;
the engine settings are the RTX 4090 run's (max_num_seqs 256, max_num_batched_tokens 2048,
max_model_len 32768, async scheduling, prefix caching, gpu_memory_utilization 0.9).

Table 1, the replays: KV blocks as the simulator derives them (sim/memory.py: vLLM 0.19's
profile-run terms, the Triton sampler's peak over the whole vocabulary, which every TP rank
holds after the logits' all-gather, and the cuBLAS workspace; the RTX PRO 6000 has no
catalogued non-torch term, so the default), beside the blocks with the RTX 4090's implied
non-torch term in its place (a bound on what an uncatalogued term does), and the latency
statistics.

Table 2, the step times: the simulator's step (system backend, CUDA-graph padding, TP
collectives) against the bundle's own rows summed by hand from the CSVs (dense rows at the
step's tokens, the attention row, lm_head and sampler rows, times the layers), for decode
steps at KV 1,024 and one 2,048-token prompt chunk. The difference is the TP communication:
two all-reduces per layer, the embedding's all-reduce and the logits' all-gather, on the
cluster file's link.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import replace
from pathlib import Path

import sim
from sim.latency.base import BatchShape
from sim.memory import device_traits, memory_budget
from sim.model import load_model
from sim.paths import shared_data_root

CASES = (("meta-llama/Llama-3.1-8B", 1, "sharegpt-llama-3.1-8b-300-sps10.jsonl"),
         ("meta-llama/Llama-3.1-8B", 2, "sharegpt-llama-3.1-8b-300-sps10.jsonl"),
         ("Qwen/Qwen3-32B", 1, "sharegpt-qwen3-32b-300-sps10.jsonl"),
         ("Qwen/Qwen3-32B", 2, "sharegpt-qwen3-32b-300-sps10.jsonl"))
HARDWARE = "RTXPRO6000"
VISIBLE = "validation/RTXPRO6000-Qwen3-30B-A3B-DP2-EP2/cluster.json"


def cluster_for(model: str, tp: int) -> sim.ClusterConfig:
    """The visible RTX PRO 6000 run's cluster file with one ``model`` instance at ``tp``."""
    d = json.loads((shared_data_root() / VISIBLE).read_text())
    node = d["nodes"][0]
    inst = dict(node["instances"][0])
    for k in ("ep_size", "dp_group"):
        inst.pop(k, None)
    inst.update(model_name=model, num_npus=tp, tp_size=tp)
    node = dict(node, num_instances=1, instances=[inst])
    return sim.parse_cluster(dict(d, nodes=[node]), source=f"{VISIBLE} ({model} tp{tp})")


def options(args) -> sim.SimOptions:
    return sim.SimOptions(max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens,
                          max_model_len=32768, async_scheduling=True,
                          latency_provider="measured")


def replay_row(model_name: str, tp: int, workload: str, args) -> list[str]:
    cluster = cluster_for(model_name, tp)
    model = load_model(model_name)
    inst = cluster.instances[0]
    res = sim.simulate(cluster, sim.load_jsonl(shared_data_root() / "workloads" / workload,
                                               limit=300), options(args))
    s = res.summary
    blocks = s["kv_blocks"]["0"]
    as_4090 = replace(device_traits(HARDWARE),
                      non_torch_bytes=device_traits("RTX4090").non_torch_bytes)
    implied = memory_budget(inst, model, 16, args.max_num_batched_tokens, args.max_num_seqs,
                            device=as_4090).num_blocks
    ttft, tpot, e2e = s["engine_ttft_ms"], s["tpot_ms"], s["engine_latency_ms"]
    return [f"{model_name.split('/')[1]} tp{tp}", f"{blocks:,}",
            f"{implied:,} ({100 * (implied - blocks) / blocks:+.1f}%)",
            f"{ttft['mean']:,.0f}", f"{ttft['p90']:,.0f}", f"{tpot['mean']:.2f}",
            f"{tpot['p90']:.2f}", f"{e2e['mean']:,.0f}", str(s["preemptions"]),
            str(s.get("latency_off_grid_lookups", 0))]


def _rows(path: Path, key_cols: tuple[str, ...]) -> dict:
    with path.open(newline="") as fh:
        return {tuple(r[c] for c in key_cols): float(r["time_us"]) for r in csv.DictReader(fh)}


def bundle_sum_us(bundle: Path, model, tokens: int, seqs: int, attn_key: tuple) -> float:
    """One step from the bundle's rows, summed by hand: every grid point is measured."""
    dense = _rows(bundle / "dense.csv", ("layer", "tokens"))
    per_seq = _rows(bundle / "per_sequence.csv", ("layer", "sequences"))
    attn = _rows(bundle / "attention.csv",
                 ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode"))
    t = str(tokens)
    block = sum(attn[tuple(map(str, attn_key))] if name == "attention" else dense[(name, t)]
                for name in model.block_sequence)
    ends = dense[("embedding", t)] + dense[("final_layernorm", t)] \
        + per_seq[("lm_head", str(seqs))] + per_seq[("sampler", str(seqs))]
    return ends + model.num_hidden_layers * block


STEPS = (("decode 1 @ KV 1024", BatchShape(1, 1, 0, 0, 1, 1024, 1024, 1024, 0, 1024 ** 2),
          1, 1, (0, 0, 1, 1024)),
         ("decode 32 @ KV 1024", BatchShape(32, 32, 0, 0, 32, 32 * 1024, 1024, 1024, 0,
                                            32 * 1024 ** 2), 32, 32, (0, 0, 32, 1024)),
         ("decode 128 @ KV 1024", BatchShape(128, 128, 0, 0, 128, 128 * 1024, 1024, 1024, 0,
                                             128 * 1024 ** 2), 128, 128, (0, 0, 128, 1024)),
         ("decode 256 @ KV 1024", BatchShape(256, 256, 0, 0, 256, 256 * 1024, 1024, 1024, 0,
                                             256 * 1024 ** 2), 256, 256, (0, 0, 256, 1024)),
         ("prompt chunk 2048", BatchShape(2048, 1, 2048, 0), 2048, 1, (2048, 0, 0, 0)))


def step_rows(model_name: str, tp: int, args) -> list[list[str]]:
    s = sim.Simulator(cluster_for(model_name, tp), options(args))
    inst = s.instances[0]
    bundle = Path(inst.provider.source) / f"tp{tp}"
    out = []
    for label, shape, tokens, seqs, key in STEPS:
        ns = s.backend.iteration_ns(inst, shape)
        rows = bundle_sum_us(bundle, inst.model, tokens, seqs, key) * 1e3
        out.append([f"{model_name.split('/')[1]} tp{tp}", label, f"{ns / 1e6:.3f}",
                    f"{rows / 1e6:.3f}", f"{(ns - rows) / 1e6:.3f}",
                    f"{100 * (ns - rows) / ns:.1f}%"])
    return out


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    args = ap.parse_args(argv)
    if not (shared_data_root() / VISIBLE).is_file():
        print(f"tp_replay_audit: error: {shared_data_root() / VISIBLE} is missing",
              file=sys.stderr)
        return 2
    print(f"RTX PRO 6000 replays (max_num_seqs {args.max_num_seqs}, max_num_batched_tokens "
          f"{args.max_num_batched_tokens}); times in ms\n")
    print(_table(["case", "KV blocks sim", "with the RTX 4090's non-torch",
                  "TTFT mean", "TTFT p90", "TPOT mean", "TPOT p90", "E2E mean",
                  "preempted", "off-grid"],
                 [replay_row(m, tp, w, args) for m, tp, w in CASES]))
    print("\nStep times (ms): the simulator against the bundle's rows summed by hand\n")
    print(_table(["case", "step", "sim", "bundle rows", "sim - rows", "share"],
                 [r for m, tp, _ in CASES for r in step_rows(m, tp, args)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
