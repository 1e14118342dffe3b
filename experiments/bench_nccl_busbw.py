"""All-reduce bus bandwidth vs message size on the H100 catalogue entry, next to nccl-tests.

Usage: PYTHONPATH=.:astra-sim python experiments/bench_nccl_busbw.py [--hardware H100-SXM]

For TP 2, 4 and 8 on one node, the instance network is the one ``llmsim run`` simulates
(sim.topology: NVSwitch as a switch with one per-GPU NVLink4 link of 450 GB/s per
direction, 300 ns per hop, ring all-reduce, local-mem-bw = the GPU's 3350 GB/s HBM), and
each size is one all-reduce timed by the in-process astra-sim backend. Bus bandwidth is
nccl-tests' definition (doc/PERFORMANCE.md in NVIDIA/nccl-tests):

    algbw = size / time,   busbw = algbw * 2 (n - 1) / n

Published reference points for 8x H100 SXM (NVLink4 + NVSwitch), large messages:

- 370 GB/s busbw with NCCL_ALGO=RING: "450GB/s is the line rate. With the protocol
  overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s, which you can
  observe as BusBw ... when running with NCCL_ALGO=RING" (S. Jeaugey, NCCL maintainer,
  https://github.com/NVIDIA/nccl-tests/issues/212);
- ~480 GB/s busbw with the default NVLink SHARP (NVLS) algorithm (same thread), which
  reduces inside the NVSwitch; ASTRA-Sim's collectives have no in-switch reduction, so the
  simulator is compared with the ring figure;
- 330 GB/s (NVLS off) and 430 GB/s (NVLS on) on a single 8x H100 node with 4-8 GB messages
  (https://github.com/NVIDIA/nccl/issues/1221).

The published figures are for 8 GPUs; busbw is normalised so that a ring reaches the same
per-link figure at every GPU count, which is what the TP 2 and 4 rows are held to.
"""

from __future__ import annotations

import argparse

from astrasim import CollectiveCommType as CT
from astrasim import GraphBuilder

import sim
from sim.backend import AstraInprocBackend
from sim.hardware import load_hardware
from sim.topology import instance_topology

#: nccl-tests' large-message busbw for 8x H100 SXM with NCCL_ALGO=RING (see the docstring)
NCCL_RING_BUSBW = 370.0
NCCL_NVLS_BUSBW = 480.0
SIZES = [1 << k for k in range(13, 34, 2)]  # 8 KiB .. 8 GiB, x4
LARGE = 256 << 20  # "large message": 256 MiB and up


def _cluster(hw: str, tp: int) -> sim.ClusterConfig:
    spec = load_hardware(hw)
    inst = {"model_name": "meta-llama/Llama-3.1-8B", "hardware": spec.name,
            "npu_mem": {"mem_size": spec.mem_size_GiB, "mem_bw": spec.mem_bw_GBps,
                        "mem_latency": 0},
            "num_npus": tp, "tp_size": tp}
    return sim.parse_cluster({"num_nodes": 1, "nodes": [{"num_instances": 1,
                                                          "instances": [inst]}]})


def busbw_table(hw: str, tps=(2, 4, 8)) -> dict[int, list[tuple[int, int, float]]]:
    """{tp: [(size bytes, ns, busbw GB/s), ...]}"""
    backend = AstraInprocBackend()
    out = {}
    for tp in tps:
        c = _cluster(hw, tp)
        topo = instance_topology(c, c.instances[0])
        rows = []
        for size in SIZES:
            b = GraphBuilder()
            b.coll(CT.ALL_REDUCE, size, involved_dim=[True])
            g = b.build()
            ns = backend.run_graphs(topo, {i: g.copy_for(i) for i in range(tp)})
            rows.append((size, ns, size / ns * 2 * (tp - 1) / tp))
        out[tp] = rows
    return out


def _fmt_size(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n >> k} {unit}"
    return f"{n} B"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="H100-SXM")
    args = ap.parse_args(argv)
    spec = load_hardware(args.hardware)
    table = busbw_table(spec.name)
    tps = sorted(table)
    print(f"All-reduce bus bandwidth (GB/s), {spec.name}: {spec.link_type} "
          f"{spec.link_bw_GBps:g} GB/s per direction, {spec.link_topology}, ring all-reduce")
    print()
    print("| size | " + " | ".join(f"TP{tp} time (us) | TP{tp} busbw" for tp in tps) + " |")
    print("|---:|" + "---:|---:|" * len(tps))
    for i, size in enumerate(SIZES):
        cells = []
        for tp in tps:
            _, ns, bw = table[tp][i]
            cells.append(f"{ns / 1e3:,.1f} | {bw:.1f}")
        print(f"| {_fmt_size(size)} | " + " | ".join(cells) + " |")
    print()
    peak = max(bw for rows in table.values() for _, _, bw in rows)
    print(f"highest busbw: {peak:.1f} GB/s (per-GPU {spec.link_type}: {spec.link_bw_GBps:g} "
          f"GB/s per direction) -> {'within' if peak <= spec.link_bw_GBps else 'ABOVE'} it")
    print()
    print(f"large messages (>= {_fmt_size(LARGE)}) vs nccl-tests NCCL_ALGO=RING "
          f"{NCCL_RING_BUSBW:g} GB/s (NVLS default ~{NCCL_NVLS_BUSBW:g}, not modelled):")
    print()
    print("| TP | size | simulated busbw | vs ring 370 |")
    print("|---:|---:|---:|---:|")
    for tp in tps:
        for size, _, bw in table[tp]:
            if size >= LARGE:
                print(f"| {tp} | {_fmt_size(size)} | {bw:.1f} | "
                      f"{(bw / NCCL_RING_BUSBW - 1) * 100:+.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
