"""The simulator's TP all-reduce against vLLM 0.19's, measured on the same GPUs.

    PYTHONPATH=.:astra-sim python experiments/tp_allreduce_vs_vllm.py [--hardware H100-SXM ...]

aiconfigurator-core (the ``aic`` extra) ships vLLM 0.19.0's all-reduce
(``tensor_model_parallel_all_reduce``: custom all-reduce, symmetric memory or NCCL, as
vLLM picks them; bf16) timed on H100 SXM, H200 SXM, B200 and RTX PRO 6000 Server nodes for
2, 4 and 8 GPUs, inside a CUDA graph and eagerly (``comm/vllm/0.19.0/
custom_allreduce_perf.parquet``; message sizes in elements). For each card in the catalogue
with such data, this prints the all-reduce one step of an instance runs in the simulator
(``sim.graph_generator.tp_all_reduce`` on the instance network ``llmsim run`` builds from
the catalogue's link, vLLM's one-stage custom all-reduce below its limit for two GPUs,
else a ring) next to vLLM's, for the hidden sizes of a Llama-3.1-70B step (8,192 bf16
values a token).

What it shows (2026-11-26, after the custom all-reduce took the measured kernel's time):
below the custom kernel's limit a TP2 all-reduce on a catalogue link is the kernel's
measured line (``--fit`` prints the catalogue's custom_allreduce_* fields from this data):
H100 0.97-1.01 of vLLM's time up to 256 tokens of Llama-3.1-70B (0.56-0.77 before, at the
link's full bandwidth), B200 0.91-1.00, RTX PRO 6000 0.99-1.13 (0.35-0.51 before, on the
link NCCL measured between two of the cards: the kernel polls its peer's flags and reads its
buffer across PCIe, about 20 us and 15 GB/s). Above the limit vLLM runs NCCL (or symmetric
memory) and the simulator a ring on the link: RTX PRO 6000 0.51, on the link NCCL measured
between two cards on LLMServingSim's host (28.73 GiB/s); vLLM's NCCL path on NVIDIA's node
keeps the custom kernel's 15 GB/s (the same node's raw NCCL all-reduce reaches about twice
that: aiconfigurator's nccl_perf data), so which host a run was on decides that part. TP
4/8 run a ring, whose hop latencies stand in for the fixed cost: H100 TP4 0.64-0.84, TP8
0.94-1.64 (14 hops at one token); vLLM runs its custom all-reduce (one or two rounds) or
symmetric memory there.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from astrasim import GraphBuilder  # noqa: E402

import sim  # noqa: E402
from sim.backend import (AstraInprocBackend, custom_all_reduce_below,  # noqa: E402
                         custom_all_reduce_kernel)
from sim.engine import build_instances  # noqa: E402
from sim.graph_generator import tp_all_reduce  # noqa: E402
from sim.hardware import load_hardware  # noqa: E402

HIDDEN = 8192            # Llama-3.1-70B
TOKENS = (1, 8, 64, 256, 1024, 2048, 8192)
HARDWARE = ("H100-SXM", "H200-SXM", "B200", "RTXPRO6000")


def vllm_table(hardware: str):
    """{(kernel_source, gpus): (sizes in elements, ms)} of vLLM 0.19.0's all-reduce on the
    card's aiconfigurator system, or None without the data."""
    if importlib.util.find_spec("aiconfigurator_core") is None:
        return None
    import aiconfigurator_core
    import pandas as pd

    from sim.latency.aic import HARDWARE_TO_SYSTEM

    system = HARDWARE_TO_SYSTEM.get(hardware)
    path = (Path(aiconfigurator_core.__file__).parent / "systems" / "data" / str(system)
            / "comm" / "vllm" / "0.19.0" / "custom_allreduce_perf.parquet")
    if not path.is_file():
        return None
    df = pd.read_parquet(path)
    out = {}
    for (kind, gpus), g in df.groupby(["kernel_source", "num_gpus"]):
        g = g.sort_values("message_size")
        out[(str(kind), int(gpus))] = (g["message_size"].tolist(), g["latency"].tolist())
    return out


def at(curve, elements: int) -> float:
    """us at ``elements``, log-log interpolated (clamped at the ends)."""
    sizes, ms = curve
    if elements <= sizes[0]:
        return ms[0] * 1e3
    if elements >= sizes[-1]:
        return ms[-1] * 1e3
    for i in range(1, len(sizes)):
        if elements <= sizes[i]:
            t = (math.log(elements) - math.log(sizes[i - 1])) / (math.log(sizes[i])
                                                                 - math.log(sizes[i - 1]))
            return math.exp(math.log(ms[i - 1]) + t * (math.log(ms[i]) - math.log(ms[i - 1]))) * 1e3
    return ms[-1] * 1e3


def _instance(hardware: str, tp: int):
    """A TP ``tp`` instance on ``hardware`` from a cluster file without link values."""
    spec = load_hardware(hardware)
    cluster = sim.parse_cluster({"num_nodes": 1, "nodes": [{"num_instances": 1, "instances": [{
        "model_name": "meta-llama/Llama-3.1-70B", "hardware": spec.name,
        "npu_mem": {"mem_size": spec.mem_size_GiB, "mem_bw": spec.mem_bw_GBps,
                    "mem_latency": 0},
        "num_npus": tp, "tp_size": tp}]}]})
    return build_instances(cluster, sim.SimOptions(latency_provider="roofline"))[0]


def simulated_us(backend, hardware: str, tp: int, nbytes: int) -> float:
    inst = _instance(hardware, tp)
    involved = [True] + [False] * (len(inst.network.dims) - 1)
    one_shot = custom_all_reduce_below(inst)
    kernel = custom_all_reduce_kernel(inst)
    graphs = {}
    for rank in range(tp):
        b = GraphBuilder(rank)
        tp_all_reduce(b, nbytes, involved, one_shot, "tp_all_reduce", kernel)
        graphs[rank] = b.build()
    return backend.run_graphs(inst.network, graphs, name="tp_all_reduce") / 1e3


#: the smallest message of the fit: below it the measured curve is the kernel's fixed cost
FIT_FROM_BYTES = 256 << 10


def fit_custom_all_reduce(hardware: str, graph) -> tuple[float, float, float]:
    """(smallest time us, intercept us, bandwidth GB/s) of vLLM's one-stage custom
    all-reduce between two ``hardware`` cards in a CUDA graph (``graph``: vLLM's measured
    curve, sizes in bf16 elements, ms): the intercept and bandwidth of the straight line
    fitted, by relative error, to the messages from FIT_FROM_BYTES up to the largest the
    custom kernel takes on the card (``custom_all_reduce_below`` of a TP2 instance); the
    catalogue's custom_allreduce_min_us / _latency_us / _bw_GBps."""
    import numpy as np

    limit = custom_all_reduce_below(_instance(hardware, 2))
    sizes = np.asarray(graph[0], dtype=float) * 2
    us = np.asarray(graph[1], dtype=float) * 1e3
    used = (sizes >= FIT_FROM_BYTES) & (sizes < limit)
    slope, intercept = np.polyfit(sizes[used], us[used], 1, w=1 / us[used])
    return float(us.min()), float(intercept), float(1e-3 / slope)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", nargs="+", default=list(HARDWARE))
    ap.add_argument("--fit", action="store_true",
                    help="print only the catalogue's custom all-reduce fields fitted to "
                         "vLLM's measured curve (fit_custom_all_reduce)")
    a = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    backend = AstraInprocBackend()
    for hardware in a.hardware:
        table = vllm_table(hardware)
        if table is None:
            print(f"{hardware}: no vLLM 0.19.0 all-reduce data (aiconfigurator-core absent "
                  "or without this card)\n")
            continue
        if a.fit:
            low, intercept, bw = fit_custom_all_reduce(hardware, table[("vLLM_custom_graph", 2)])
            print(f"{hardware}: custom_allreduce_min_us: {low:.3f}, custom_allreduce_latency_us: "
                  f"{intercept:.2f}, custom_allreduce_bw_GBps: {bw:.1f}")
            continue
        link = _instance(hardware, 2).network.dims[0].link
        print(f"{hardware} (link as simulated: {link.kind}, {link.topology}, "
              f"{link.bw_GBps:g} {link.unit} per direction, {link.latency_ns:g} ns per hop): "
              f"all-reduce us, bf16, {HIDDEN} values a token")
        print()
        print("| GPUs | tokens | bytes | simulated | vLLM graph | vLLM eager | sim / graph |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for tp in (2, 4, 8):
            graph = table.get(("vLLM_custom_graph", tp))
            eager = table.get(("vLLM_custom_eager", tp))
            if graph is None:
                continue
            for tokens in TOKENS:
                elements = tokens * HIDDEN
                s = simulated_us(backend, hardware, tp, 2 * elements)
                g = at(graph, elements)
                e = at(eager, elements) if eager else float("nan")
                print(f"| {tp} | {tokens:,} | {2 * elements:,} | {s:,.1f} | {g:,.1f} | "
                      f"{e:,.1f} | {s / g:.2f} |")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
