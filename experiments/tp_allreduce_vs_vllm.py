"""The simulator's TP all-reduce against vLLM 0.19's, measured on the same GPUs.

    PYTHONPATH=.:astra-sim python experiments/tp_allreduce_vs_vllm.py [--hardware H100-SXM ...]

aiconfigurator-core (the ``aic`` extra) ships vLLM 0.19.0's all-reduce
(``tensor_model_parallel_all_reduce``: custom all-reduce, symmetric memory or NCCL, as
vLLM picks them; bf16) timed on H100 SXM, H200 SXM, B200 and RTX PRO 6000 Server nodes for
2, 4 and 8 GPUs, inside a CUDA graph and eagerly (``comm/vllm/0.19.0/
custom_allreduce_perf.parquet``; message sizes in elements). ``--catalogue`` prints, per
card, the hardware catalogue's ``vllm_all_reduce_us`` field from it (the graph curves, in
bytes). Otherwise, for each card with such data, this prints a TP all-reduce as the
simulator runs it on the catalogue's link (``sim.graph_generator.tp_all_reduce`` on the
instance network ``llmsim run`` builds: vLLM's measured curve, interpolated on log-log
axes), as the link alone carries it (what a cluster file's link gets: vLLM's one-stage
custom all-reduce below its limit at TP 2, else a ring), and vLLM's measured times, for
the hidden sizes of a Qwen3-32B step (5,120 bf16 values a token: between the measured
sizes).

What it shows (2026-11-26): the simulated all-reduce is vLLM's graph time (1.00-1.02: the
curve itself, held non-decreasing where the measurement dips); the link alone gave H100 TP 2 0.14-0.74 of
it, TP 4 0.54-0.85, TP 8 0.91-1.70 (a ring's 14 hops at one token); H200 alike; B200 0.09-
1.07; RTX PRO 6000 TP 2 0.36-0.51 on the link NCCL measured between two of the cards
(vLLM's custom kernel polls its peer's flags and reads its buffer across PCIe: about 20 us
from 2 KiB up and 15 GB/s; vLLM's NCCL path above 8 MiB keeps that rate on NVIDIA's node,
where the same node's raw NCCL all-reduce reaches about twice it: aiconfigurator's
nccl_perf data). The eager curve is printed beside: its 20 us floor is the host's launch
cost, which a busy eager step hides behind its queued kernels, so the simulator takes the
graph curve for every step.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from astrasim import GraphBuilder  # noqa: E402

import sim  # noqa: E402
from sim.backend import (AstraInprocBackend, MeasuredCurve,  # noqa: E402
                         custom_all_reduce_below, measured_all_reduce)
from sim.engine import build_instances  # noqa: E402
from sim.graph_generator import tp_all_reduce  # noqa: E402
from sim.latency.aic import aic_system_data  # noqa: E402

HIDDEN = 5120            # Qwen3-32B: its sizes fall between the measured ones
TOKENS = (1, 8, 64, 256, 1024, 2048, 8192)
HARDWARE = ("H100-SXM", "H200-SXM", "B200", "RTXPRO6000")


def vllm_table(hardware: str):
    """{(kernel_source, gpus): (sizes in elements, ms)} of vLLM 0.19.0's all-reduce on the
    card's aiconfigurator system, or None without the data."""
    root = aic_system_data(hardware)
    path = None if root is None else root / "comm/vllm/0.19.0/custom_allreduce_perf.parquet"
    if path is None or not path.is_file():
        return None
    import pandas as pd

    df = pd.read_parquet(path)
    out = {}
    for (kind, gpus), g in df.groupby(["kernel_source", "num_gpus"]):
        g = g.sort_values("message_size")
        out[(str(kind), int(gpus))] = (g["message_size"].tolist(), g["latency"].tolist())
    return out


def graph_points(table, tp: int, kind: str = "vLLM_custom_graph"):
    """vLLM's measured curve at ``tp`` (``kind``: in a CUDA graph or eagerly) as the
    catalogue's ``vllm_all_reduce_us`` holds it: ((bytes, us to 3 decimals), ...)."""
    sizes, ms = table[(kind, tp)]
    return tuple((2 * e, round(t * 1e3, 3)) for e, t in zip(sizes, ms))


def vllm_us(table, tp: int, nbytes: int, kind: str = "vLLM_custom_graph") -> float:
    """vLLM's measured time at ``nbytes``, interpolated as the simulator reads its curves
    (sim.backend.MeasuredCurve)."""
    return MeasuredCurve(kind, graph_points(table, tp, kind)).ns(nbytes) / 1e3


def _instance(hardware: str, tp: int):
    """A TP ``tp`` instance on ``hardware`` from a cluster file without link values."""
    cluster = sim.parse_cluster({"num_nodes": 1, "nodes": [{"num_instances": 1, "instances": [{
        "model_name": "meta-llama/Llama-3.1-70B", "hardware": hardware,
        "num_npus": tp, "tp_size": tp}]}]})
    return build_instances(cluster, sim.SimOptions(latency_provider="roofline"))[0]


def simulated_us(backend, hardware: str, tp: int, nbytes: int, on_link: bool = False) -> float:
    """One TP all-reduce of ``nbytes`` as a step of a TP ``tp`` instance runs it; with
    ``on_link``, as the catalogue's link alone would carry it (a one-stage all-gather below
    vLLM's custom all-reduce limit at TP 2, else a ring: what a cluster file's link gets)."""
    inst = _instance(hardware, tp)
    involved = [True] + [False] * (len(inst.network.dims) - 1)
    curve = None if on_link else measured_all_reduce(inst)
    graphs = {}
    for rank in range(tp):
        b = GraphBuilder(rank)
        tp_all_reduce(b, nbytes, involved, custom_all_reduce_below(inst), "tp_all_reduce",
                      curve)
        graphs[rank] = b.build()
    return backend.run_graphs(inst.network, graphs, name="tp_all_reduce") / 1e3


def catalogue_block(table) -> str:
    """The catalogue's ``vllm_all_reduce_us`` field (YAML) from vLLM's measured curves inside
    a CUDA graph: bytes (bf16 elements x 2) and us (3 decimals), by TP degree."""
    lines = ["vllm_all_reduce_us:"]
    for tp in sorted(tp for kind, tp in table if kind == "vLLM_custom_graph"):
        pairs = [f"[{b}, {us!r}]" for b, us in graph_points(table, tp)]
        rows = [", ".join(pairs[i:i + 5]) for i in range(0, len(pairs), 5)]
        lines.append(f"  {tp}: [" + ",\n      ".join(rows) + "]")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", nargs="+", default=list(HARDWARE))
    ap.add_argument("--catalogue", action="store_true",
                    help="print only each card's vllm_all_reduce_us field for the hardware "
                         "catalogue (catalogue_block)")
    a = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    backend = AstraInprocBackend()
    for hardware in a.hardware:
        table = vllm_table(hardware)
        if table is None:
            print(f"{hardware}: no vLLM 0.19.0 all-reduce data (aiconfigurator-core absent "
                  "or without this card)\n")
            continue
        if a.catalogue:
            print(f"# {hardware}\n{catalogue_block(table)}\n")
            continue
        link = _instance(hardware, 2).network.dims[0].link
        print(f"{hardware} (link: {link.kind}, {link.topology}, {link.bw_GBps:g} {link.unit} "
              f"per direction, {link.latency_ns:g} ns per hop): all-reduce us, bf16, "
              f"{HIDDEN} values a token")
        print()
        print("| GPUs | tokens | bytes | on the link | simulated | vLLM graph | vLLM eager | "
              "link / graph | sim / graph |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for tp in (2, 4, 8):
            if ("vLLM_custom_graph", tp) not in table:
                continue
            has_eager = ("vLLM_custom_eager", tp) in table
            for tokens in TOKENS:
                nbytes = 2 * tokens * HIDDEN
                link_us = simulated_us(backend, hardware, tp, nbytes, on_link=True)
                s = simulated_us(backend, hardware, tp, nbytes)
                g = vllm_us(table, tp, nbytes)
                e = vllm_us(table, tp, nbytes, "vLLM_custom_eager") if has_eager else float("nan")
                print(f"| {tp} | {tokens:,} | {nbytes:,} | {link_us:,.1f} | {s:,.1f} | "
                      f"{g:,.1f} | {e:,.1f} | {link_us / g:.2f} | {s / g:.2f} |")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
