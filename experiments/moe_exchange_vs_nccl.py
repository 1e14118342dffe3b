"""An MoE layer's DP exchange as the simulator runs it on the catalogue's links, against
NCCL's own all-gather and reduce-scatter measured on the same GPUs.

    PYTHONPATH=.:astra-sim python experiments/moe_exchange_vs_nccl.py [--hardware H100-SXM ...]
    PYTHONPATH=.:astra-sim python experiments/moe_exchange_vs_nccl.py --catalogue

With data parallelism and vLLM 0.19's default ``allgather_reducescatter`` backend every MoE
layer all-gathers each DP rank's hidden states and router logits (pynccl ``all_gather``,
``all_gatherv`` when the ranks' token counts differ) and reduce-scatters the expert outputs
(sim.moe_wave). aiconfigurator-core (the ``aic`` extra) ships NCCL's collectives timed on
H100 SXM, H200 SXM, B200, A100 SXM, L40S and RTX PRO 6000 Server nodes for 2, 4 and 8
GPUs (``comm/nccl/<version>/nccl_perf.parquet``: nccl-tests style, message sizes in
elements of the whole buffer, half precision; the newest version per card is read).

``--catalogue`` prints each card's ``nccl_us`` field for the hardware catalogue from it
(bytes and us). The L40S's 4- and 8-GPU curves are left out: their large-message bus
bandwidth is 1-5 GB/s, below what a host-memory bounce on a PCIe 4 card sustains, so that
node's GPUs did not talk through anything the catalogue's link describes.

Otherwise, per card and GPU count, at the sizes of a Qwen3-30B-A3B exchange (2,048 bf16
hidden values and 128 router logits a token): the exchange as the catalogue's link alone
carried it (the ASTRA-Sim link model: what a card without curves, or a cluster file's link,
gets), as the simulator now runs it (NCCL's curves), and NCCL's measured time.

What it shows (2026-11-26, newest NCCL per card: 2.29.2, A100 and L40S 2.27.3): the link
alone gave 0.06-0.45 of NCCL's time on the NVLink cards at 1-512 tokens a rank (NCCL's
5-10 us a call against the link's 0.3 us hops; H100 at 2 GPUs 0.11-0.42, so a 128-token
decode wave of Qwen3-30B-A3B missed ~18 us a layer, ~0.9 ms a step), 0.3-0.8 at 2,048;
the RTX PRO 6000's measured link (the catalogue's ``measured_link_*``, NCCL's own pair
calibration) 0.77-1.09 at 2 GPUs. The simulator now takes NCCL's times (1.00).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sim  # noqa: E402
from sim.backend import AstraInprocBackend, MeasuredCurve  # noqa: E402
from sim.engine import Simulator  # noqa: E402
from sim.latency.aic import aic_system_data  # noqa: E402
from sim.moe_wave import exchange_graphs  # noqa: E402
from sim.topology import group_topology  # noqa: E402

HARDWARE = ("H100-SXM", "H200-SXM", "B200", "A100-80G-SXM", "L40S", "RTXPRO6000")
MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507"
TOKENS = (1, 16, 128, 512, 2048)
#: GPU counts whose curves the catalogue leaves out (see the module docstring)
LEFT_OUT = {"L40S": (4, 8)}
OPS = ("all_gather", "reduce_scatter")


def nccl_table(hardware: str):
    """(version, {(op, gpus): (sizes in elements, ms)}) of NCCL's half-precision
    all-gather and reduce-scatter on the card's aiconfigurator system (its newest NCCL
    version), or None without the data."""
    root = aic_system_data(hardware)
    versions = [] if root is None else sorted(
        root.glob("comm/nccl/*/nccl_perf.parquet"),
        key=lambda p: tuple(int(x) for x in p.parent.name.split(".")))
    if not versions:
        return None
    import pandas as pd

    df = pd.read_parquet(versions[-1])
    df = df[(df["nccl_dtype"] == "half") & df["op_name"].isin(OPS)]
    out = {}
    for (op, gpus), g in df.groupby(["op_name", "num_gpus"]):
        g = g.sort_values("message_size")
        out[(str(op), int(gpus))] = (g["message_size"].tolist(), g["latency"].tolist())
    return versions[-1].parent.name, out


def curve_points(table, op: str, gpus: int):
    """NCCL's measured curve as the catalogue's ``nccl_us`` holds it: ((bytes, us to 3
    decimals), ...) (half precision: 2 bytes an element)."""
    sizes, ms = table[(op, gpus)]
    return tuple((2 * e, round(t * 1e3, 3)) for e, t in zip(sizes, ms))


def catalogue_block(version: str, table, hardware: str) -> str:
    """The catalogue's ``nccl_us`` field (YAML) for ``hardware``."""
    lines = [f"# NCCL {version} (aiconfigurator-core's nccl_perf, half precision; bytes of "
             "the whole buffer, us)", "nccl_us:"]
    for op in OPS:
        lines.append(f"  {op}:")
        for gpus in sorted(n for o, n in table if o == op and n not in LEFT_OUT.get(hardware, ())):
            pairs = [f"[{b}, {us!r}]" for b, us in curve_points(table, op, gpus)]
            rows = [", ".join(pairs[i:i + 4]) for i in range(0, len(pairs), 4)]
            lines.append(f"    {gpus}: [" + ",\n        ".join(rows) + "]")
    return "\n".join(lines)


def _simulator(hardware: str, gpus: int) -> Simulator:
    """A DP group of ``gpus`` one-GPU ranks with expert parallelism on ``hardware``, from a
    cluster file without link values (the catalogue's link)."""
    cluster = sim.parse_cluster({"num_nodes": 1, "nodes": [{
        "num_instances": gpus, "instances": [{
            "model_name": MODEL, "hardware": hardware, "num_npus": 1, "tp_size": 1,
            "ep_size": gpus, "dp_group": "A"} for _ in range(gpus)]}]})
    return Simulator(cluster, sim.SimOptions(latency_provider="roofline"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", nargs="+", default=list(HARDWARE))
    ap.add_argument("--catalogue", action="store_true",
                    help="print only each card's nccl_us field for the hardware catalogue")
    a = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    backend = AstraInprocBackend()
    for hardware in a.hardware:
        found = nccl_table(hardware)
        if found is None:
            print(f"{hardware}: no NCCL data (aiconfigurator-core absent or without this "
                  "card)\n")
            continue
        version, table = found
        if a.catalogue:
            print(f"# {hardware}\n{catalogue_block(version, table, hardware)}\n")
            continue
        print(f"{hardware} (NCCL {version}): one MoE layer's all-gather + reduce-scatter, us, "
              f"{MODEL}")
        print()
        print("| GPUs | tokens a rank | link alone | simulated | NCCL | link / NCCL | "
              "sim / NCCL |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for gpus in (2, 4, 8):
            if any((op, gpus) not in table for op in OPS):
                continue
            s = _simulator(hardware, gpus)
            model = s.instances[0].model
            hidden = model.hidden_size * model.dtype_bytes
            logits = model.num_experts * model.dtype_bytes
            network = group_topology(s.cluster, [i.config for i in s.instances], gpus)
            curves = {op: MeasuredCurve(op, curve_points(table, op, gpus)) for op in OPS}
            for tokens in TOKENS:
                shares = [tokens] * gpus
                graphs = exchange_graphs("allgather_reducescatter", gpus, shares, hidden,
                                         logits, 0)
                link_us = backend.run_graphs(network, graphs, name="moe_exchange") / 1e3
                sim_us = s.moe_wave._exchange_ns(s.instances, shares) / 1e3
                nccl_us = (curves["all_gather"].ns(gpus * tokens * (hidden + logits))
                           + curves["reduce_scatter"].ns(gpus * tokens * hidden)) / 1e3
                print(f"| {gpus} | {tokens:,} | {link_us:,.1f} | {sim_us:,.1f} | "
                      f"{nccl_us:,.1f} | {link_us / nccl_us:.2f} | {sim_us / nccl_us:.2f} |")
            s.close()
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
