"""One rank's MoE layer per latency provider and expert layout, and a TP x EP replay.

    PYTHONPATH=.:astra-sim python experiments/moe_expert_layout.py [--model Qwen/Qwen3-30B-A3B]

vLLM 0.19 (FusedMoEParallelConfig.make) lays experts out per rank: without expert
parallelism every rank of a TP group holds every expert, its intermediate width sharded
over the tp ranks; with it, each rank holds num_experts / ep whole experts. A provider's
``moe_ns(tokens, activated)`` is one rank's layer in its instance's layout, ``tokens`` x
top_k being the assignments that rank runs. The first table gives, per provider, the
rank's time (us) at TP1, at TP2 (1/2 shards: about half of TP1's), and at TP2 x EP2 and
TP1 x EP2 (whole experts: as TP1 at the same assignments and activated experts; the aic
provider routes tokens by aiconfigurator's own model, so only the two EP columns agree
there). The second replays a short synthetic workload with TP2, TP2 x EP2 and TP1 per
provider: the same expert FLOPs and bytes per rank with and without EP, so the two TP2
rows should be close.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sim  # noqa: E402
from sim.errors import InputError  # noqa: E402
from sim.latency.base import load_providers  # noqa: E402
from sim.model import load_model  # noqa: E402
from sim.paths import shared_data_root  # noqa: E402

LAYOUTS = (("tp1", 1, 1), ("tp2", 2, 1), ("tp2 x ep2", 2, 2), ("tp1 x ep2", 1, 2))


def _providers() -> list[tuple[str, str]]:
    out = [("roofline", "H100-SXM")]
    if importlib.util.find_spec("aiconfigurator_core") is not None:
        out.append(("aic", "H100-SXM"))
    if (shared_data_root() / "profiles" / "RTXPRO6000").is_dir():
        out.append(("measured", "RTXPRO6000"))
    return out


def rank_table(model_name: str) -> None:
    model = load_model(model_name)
    reg = load_providers()
    print(f"One rank's MoE layer (us), {model.name}: tokens x top_k assignments on the "
          "activated experts given")
    print()
    print("| provider | tokens | activated | " + " | ".join(n for n, _, _ in LAYOUTS) + " |")
    print("|---|---:|---:|" + "---:|" * len(LAYOUTS))
    for kind, hw in _providers():
        try:
            provs = [reg.create(kind, model, hw, tp, ep_size=ep) for _, tp, ep in LAYOUTS]
        except InputError as exc:
            print(f"| {kind} ({hw}) | cannot build: {exc} |")
            continue
        for tokens, active in ((16, 48), (64, 64), (256, 64), (1024, 64), (4096, 64)):
            cells = " | ".join(f"{p.moe_ns(tokens, active) / 1e3:,.0f}" for p in provs)
            print(f"| {kind} ({hw}) | {tokens} | {active} | {cells} |")
    print()


def layout_replay(kind: str, hardware: str, model_name: str, tp: int, ep: int) -> dict:
    """The summary of a short burst (48 requests, 256-1024 prompt tokens, 32-96 output
    tokens, 200 req/s; max_num_seqs 64, max_num_batched_tokens 2048) on one TP ``tp`` x EP
    ``ep`` instance of ``model_name`` with the ``kind`` provider."""
    cluster = sim.parse_cluster({"num_nodes": 1, "link_bw": 450, "link_latency": 1000, "nodes": [{
        "num_instances": 1, "cpu_mem": {"mem_size": 512, "mem_bw": 50, "mem_latency": 0},
        "instances": [{"model_name": model_name, "hardware": hardware,
                       "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0,
                                   "mem_util": 0.9},
                       "num_npus": tp, "tp_size": tp, "ep_size": ep}]}]})
    wl = sim.generate(sim.WorkloadSpec(num_requests=48, arrival="poisson", rate=200.0,
                                       input=sim.LengthDist("uniform", low=256, high=1024),
                                       output=sim.LengthDist("uniform", low=32, high=96),
                                       seed=3))
    opts = sim.SimOptions(max_num_seqs=64, max_num_batched_tokens=2048, latency_provider=kind)
    return sim.Simulator(cluster, opts).run(wl).summary


def replay_table(model_name: str) -> None:
    print("Replay (48 requests, 256-1024 prompt tokens, 32-96 output tokens, 200 req/s; "
          "max_num_seqs 64, max_num_batched_tokens 2048)")
    print()
    print("| provider | layout | TPOT mean ms | TTFT mean ms |")
    print("|---|---|---:|---:|")
    for kind, hw in _providers():
        for name, tp, ep in (("tp2", 2, 1), ("tp2 x ep2", 2, 2), ("tp1", 1, 1)):
            s = layout_replay(kind, hw, model_name, tp, ep)
            print(f"| {kind} ({hw}) | {name} | {s['tpot_ms']['mean']:.2f} | "
                  f"{s['ttft_ms']['mean']:.1f} |")
    print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen3-30B-A3B")
    a = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    rank_table(a.model)
    replay_table(a.model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
